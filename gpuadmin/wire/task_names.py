"""Every Celery task's name, written once: the task's decorator and whoever sends it import it from here.

Tasks cross the broker by name. Central sends agent tasks without importing
their code (and agents send central tasks the same way), so the name is the
contract between the two sides: change one here and both sides follow. The
prefix decides the route (``gpuadmin.celery.route_task``): agent tasks must be
sent to a host's queue, central tasks go to ``central``.

No Django and no Celery here, so anything may import it.
"""

from __future__ import annotations

AGENT_PREFIX = "gpuadmin.agent."
CENTRAL_PREFIXES = ("gpuadmin.fleet.", "gpuadmin.kills.", "gpuadmin.notify.", "gpuadmin.audit.",
                    "gpuadmin.fairuse.", "gpuadmin.usage.")

# Agent side: run by the agent of the host whose queue (host.<name>) they are sent to.
PROBE_HOST = "gpuadmin.agent.probe_host"
EXECUTE_KILL_ORDER = "gpuadmin.agent.execute_kill_order"

# Central side: run by central workers (queue `central`), which have the database.
INGEST_SNAPSHOT = "gpuadmin.fleet.ingest_snapshot"
INGEST_SNAPSHOT_UPDATE = "gpuadmin.fleet.ingest_snapshot_update"  # what moved since a snapshot
MAINTAIN_HISTORY = "gpuadmin.fleet.maintain_history"
RECORD_KILL_PROGRESS = "gpuadmin.kills.record_kill_progress"
SWEEP_KILLS = "gpuadmin.kills.sweep"
NOTIFY_KILL_EVENT = "gpuadmin.notify.kill_event"  # who hears about a kill request's event
DELIVER_NOTIFICATION = "gpuadmin.notify.deliver"  # one message to one destination, with retries
WARN_EXPIRING_REQUESTS = "gpuadmin.notify.warn_expiring"  # beat: pending requests about to expire
SYNC_PEOPLE = "gpuadmin.notify.sync_people"  # beat: people, Unix accounts and roles from the lab's directory
ANCHOR_AUDIT = "gpuadmin.audit.anchor"  # beat: sign the audit chain's head, publish it outside the database
EVALUATE_FAIR_USE = "gpuadmin.fairuse.evaluate"  # beat: live fair-use policies, one step at a time
DELIVER_FAIR_USE_NOTICE = "gpuadmin.fairuse.deliver_notice"  # one fair-use notice to its person
MAINTAIN_USAGE = "gpuadmin.usage.maintain"  # beat: write silent hosts' pending usage, prune the ledger
SEND_USAGE_DIGEST = "gpuadmin.usage.send_digest"  # beat, weekly: last week's usage digest to approvers
DELIVER_USAGE_DIGEST = "gpuadmin.usage.deliver_digest"  # one digest message to one destination
