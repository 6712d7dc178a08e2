"""The Celery app, built from Django settings (CELERY_ namespace).

Queues: ``central`` (ingest, kill progress, sweeps; needs the database),
``central.updates`` (snapshot updates, taken in batches by the workers that consume ``central``:
``gpuadmin.fleet.update_batches``) and ``host.<name>`` (one per GPU host; its agent probes and
signals and needs only the broker). This module owns the queues, the routes and the beat schedule;
the tasks' names live beside it in ``gpuadmin.wire.task_names`` (no Django there).
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Any

from celery import Celery, bootsteps, signals
from celery.worker import state as worker_state
from django.db import close_old_connections

from gpuadmin.wire import task_names

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

logger = logging.getLogger(__name__)

CENTRAL_QUEUE = "central"
# Snapshot updates, the bulk of the traffic (one per host every probe interval): a queue of their own,
# which central's workers drain in batches, one transaction each, without a Celery task per message.
CENTRAL_UPDATES_QUEUE = "central.updates"
KILL_SWEEP_PERIOD_SECONDS = 5.0
# History rollups are 5-minute buckets: rolling up at the same pace keeps charts current.
HISTORY_MAINTENANCE_PERIOD_SECONDS = 300.0
EXPIRY_WARNING_PERIOD_SECONDS = 60.0
# Events newer than the last anchor are vouched for by the database alone (docs/security.md).
AUDIT_ANCHOR_PERIOD_SECONDS = 60.0
# The usage digest covers a week; the ledger's upkeep runs with history's.
USAGE_DIGEST_PERIOD_SECONDS = 7 * 86400.0
# Fair-use policies count in minutes: one look a minute takes each step on time.
FAIR_USE_PERIOD_SECONDS = 60.0
# People, Unix accounts and roles from the lab's directory (notify.people_from_directory): a role removed
# there stops a token that is never signed in with within the hour.
SYNC_PEOPLE_PERIOD_SECONDS = 3600.0
# Sending from a web request after its commit: a broker that is down costs this little, never a hang.
SEND_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
# A periodic task that waits longer than this share of its period is dropped:
# the next one is already on its way, so late runs never pile up behind an
# offline worker.
EXPIRES_SHARE_OF_PERIOD = 0.8


def host_queue(host_name: str) -> str:
    return f"host.{host_name}"


def beat_schedule() -> dict[str, dict]:
    """Central's periodic tasks; each expires before its next run is due. Probes are not among them:
    each agent keeps its own clock (``gpuadmin.agent.probing.ProbeClock``)."""
    return {
        "sweep-kills": {
            "task": task_names.SWEEP_KILLS,
            "schedule": KILL_SWEEP_PERIOD_SECONDS,
            "options": {"expires": KILL_SWEEP_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
        "maintain-history": {
            "task": task_names.MAINTAIN_HISTORY,
            "schedule": HISTORY_MAINTENANCE_PERIOD_SECONDS,
            "options": {"expires": HISTORY_MAINTENANCE_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
        "sync-people": {
            "task": task_names.SYNC_PEOPLE,
            "schedule": SYNC_PEOPLE_PERIOD_SECONDS,
            "options": {"expires": SYNC_PEOPLE_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
        "warn-expiring-requests": {
            "task": task_names.WARN_EXPIRING_REQUESTS,
            "schedule": EXPIRY_WARNING_PERIOD_SECONDS,
            "options": {"expires": EXPIRY_WARNING_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
        "evaluate-fair-use": {
            "task": task_names.EVALUATE_FAIR_USE,
            "schedule": FAIR_USE_PERIOD_SECONDS,
            "options": {"expires": FAIR_USE_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
        "maintain-usage": {
            "task": task_names.MAINTAIN_USAGE,
            "schedule": HISTORY_MAINTENANCE_PERIOD_SECONDS,
            "options": {"expires": HISTORY_MAINTENANCE_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
        "send-usage-digest": {
            "task": task_names.SEND_USAGE_DIGEST,
            "schedule": USAGE_DIGEST_PERIOD_SECONDS,
            "options": {"expires": 3600.0},  # a digest a day late is still the week's; never a backlog
        },
        "anchor-audit": {
            "task": task_names.ANCHOR_AUDIT,
            "schedule": AUDIT_ANCHOR_PERIOD_SECONDS,
            "options": {"expires": AUDIT_ANCHOR_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
    }


class UnroutedAgentTask(ValueError):
    """An agent task sent without naming the host's queue."""


def route_task(name: str, args: object, kwargs: object, options: dict, task: object = None,
               **_: object) -> dict | None:
    """Central tasks go to `central` without every caller naming it.

    Agent tasks have no default on purpose: one sent without its host's queue
    would land in `central`, and the central worker would probe or signal its
    own box instead of the host meant. Refuse it at the sender.
    Snapshot updates go to their own queue (``CENTRAL_UPDATES_QUEUE``), whoever sends them.
    """
    if name == task_names.INGEST_SNAPSHOT_UPDATE:
        return {"queue": CENTRAL_UPDATES_QUEUE}
    if name.startswith(task_names.CENTRAL_PREFIXES):
        return {"queue": CENTRAL_QUEUE}
    if name.startswith(task_names.AGENT_PREFIX) and not options.get("queue"):
        raise UnroutedAgentTask(f"{name} must be sent to a host's queue: queue=host_queue(host_name)")
    return None


app = Celery(
    "gpuadmin",
    # Central's tasks only: a worker that consumes a host's queue loads gpuadmin.agent.worker,
    # which registers the host side's tasks on this same app.
    include=[
        "gpuadmin.fleet.tasks",  # central: ingest_snapshot, maintain_history
        "gpuadmin.fleet.update_batches",  # central: the consumer of central.updates (a bootstep)
        "gpuadmin.kills.tasks",  # central: record_kill_progress, sweep
        "gpuadmin.notify.tasks",  # central: kill_event, deliver, warn_expiring
        "gpuadmin.audit.tasks",  # central: anchor
        "gpuadmin.usage.tasks",  # central: maintain, send_digest, deliver_digest
        "gpuadmin.fairuse.tasks",  # central: evaluate, deliver_notice
    ],
)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_routes = (route_task,)
app.conf.beat_schedule = beat_schedule()
# Remote control off in every worker (central, agents, make run's): its broadcasts come through the
# broker, which every GPU host can write to. With it on, a `shutdown` stopped central, `add_consumer
# host.gpu2` made central take gpu2's kill orders, and `inspect conf` answered every setting, the
# broker's password included. With it off a worker binds no broadcast queue: nothing reaches it.
app.conf.worker_enable_remote_control = False


# A worker that stops without a stop signal (SIGTERM, SIGINT, SIGQUIT: systemd, `make run`, Ctrl+C)
# was stopped from inside: a control command, a WorkerShutdown raised by a task. Celery exits 0 then,
# which systemd's Restart=on-failure and `make run` would read as "stopped as asked". It exits with
# this status instead, so it is restarted and the journal shows it.
EXIT_STOPPED_UNASKED = 3
_stop_signal_received: list[str] = []


@signals.worker_shutting_down.connect
def _note_stop_signal(sig: str = "", **_: object) -> None:
    _stop_signal_received.append(sig)


@signals.worker_shutdown.connect
def _fail_an_unasked_stop(sender: Any = None, **_: object) -> None:
    if _stop_signal_received or not hasattr(sender, "exitcode"):
        return
    if not sender.exitcode:  # None or 0: Celery's "clean" exit
        logger.error("worker %s stopped without a stop signal; exiting with status %s",
                     getattr(sender, "hostname", "?"), EXIT_STOPPED_UNASKED)
        sender.exitcode = EXIT_STOPPED_UNASKED


# How often a worker looks whether it still asks the broker for messages (StalledConsumerGuard); it
# reconnects on the second look in a row that finds it stalled, so within twice this.
CONSUMER_CHECK_PERIOD_SECONDS = 5.0
STALLED_CONSUMER_LOG = "takes no message from the broker"


class StalledConsumer(ConnectionError):
    """The worker's prefetch credit is all taken by messages it no longer has in hand.

    A ConnectionError: every transport counts it among its connection errors (kombu's base
    transport, Redis's through OSError), which the event loop lets out to the consumer.
    """


class StalledConsumerGuard(bootsteps.StartStopStep):
    """Reconnect a worker that stopped taking messages from the broker.

    kombu's Redis transport gives a message's share of the prefetch credit back only once Redis
    has dropped it from its unacked index. An ack or reject that meets a Redis gone away raises
    before that; Celery logs "Couldn't ack" and goes on, and the credit stays taken for good.
    Take it all (concurrency 1: one task running, the next fetched and waiting for the pool
    process) and the worker never sends BRPOP again, and since none was pending kombu drops the
    dead socket without raising: no "Connection to broker lost", no reconnect, the worker up and
    deaf (tests/integration/test_redis_restart.py). No setting avoids it: health checks look at
    a pending BRPOP only, and retries end in the same raise.

    All credit taken while no task is in hand (reserved, running or scheduled) is that state and
    nothing else. Seen twice in a row, this raises in the event loop, into Celery's own path for
    a lost connection: a new channel with all its credit, the queues declared again (on a Redis
    restarted empty too). A message whose ack failed is handed out again if Redis still holds it:
    kombu's Redis delivers at least once, and would after visibility_timeout anyway.
    """

    label = "stalled consumer guard"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.timer_entry: Any = None
        self.stalled_checks = 0
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        self.stalled_checks = 0
        # In the event loop only (prefork, every gpuadmin worker): raised from a timer thread, the
        # error would be logged and nothing reconnected.
        if c.hub is not None:
            self.timer_entry = c.timer.call_repeatedly(CONSUMER_CHECK_PERIOD_SECONDS, self.check, (c,))

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    shutdown = stop

    def check(self, c: Any) -> None:
        qos = getattr(getattr(c.task_consumer, "channel", None), "qos", None)
        can_consume = getattr(qos, "can_consume", None)  # virtual transports' (Redis, filesystem) only
        in_hand = (worker_state.reserved_requests or worker_state.active_requests
                   or worker_state.scheduled_requests)  # type: ignore[attr-defined]  # ETA ones; stubs lag
        if can_consume is None or can_consume() or in_hand:
            self.stalled_checks = 0
            return
        self.stalled_checks += 1
        if self.stalled_checks >= 2:
            self.stalled_checks = 0
            logger.error("worker %s %s: its prefetch credit is held by messages it no longer has (an "
                         "ack that failed while the broker was away); reconnecting",
                         getattr(c, "hostname", "?"), STALLED_CONSUMER_LOG)
            raise StalledConsumer(f"{STALLED_CONSUMER_LOG}: prefetch credit held by no task in hand")


app.steps["consumer"].add(StalledConsumerGuard)


# Celery's Django fixup closes the database connections before and after every task unless
# CELERY_DB_REUSE_MAX (settings) is set: on PostgreSQL each snapshot then paid a new connection, a
# server process started and its catalogs read again (load.py: a fifth of a pool process's time was
# spent connecting). A task keeps its connection as a web request does, by Django's own rule:
# CONN_MAX_AGE, the health check, and a connection an error left unusable is closed. A task run
# eagerly (apply(): tests) runs inside its caller's transaction and is left alone, as the fixup does.
@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_old_connections(sender: Any = None, **_: object) -> None:
    if not getattr(getattr(sender, "request", None), "is_eager", False):
        close_old_connections()


# Python's collector looks at young objects after 700 more were made than freed, and now and then at
# every object. A central worker makes and drops thousands at a time (a full snapshot's document, a
# batch of updates), so with the defaults it collected several times a message and every few seconds
# walked all of Django and the apps (~0.1 s each time), none of which is ever garbage: 7 % of its CPU in
# the collector, in the 3,000-host live replay (benchmarks/README.md, "What each performance mechanism
# is worth"). What a worker process holds when it starts is frozen, so the collector skips it; young
# objects wait for this many.
GC_YOUNG_THRESHOLD = 10_000


@signals.worker_process_init.connect
@signals.worker_ready.connect
def settle_garbage_collector(**_: object) -> None:
    """Leave what the worker process holds now out of the collector's scans, and collect young
    objects less often: in each pool process as it starts, and in the main process once it is
    ready (where the solo pool runs the tasks)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


# Celery's own retry line is INFO, on the logger that also says "received" and "succeeded" for every
# task, which settings.LOGGING keeps quiet (GPUADMIN_TASK_LOG_LEVEL): a retry is worth a WARNING.
@signals.task_retry.connect
def _log_retry(sender: Any = None, request: Any = None, reason: object = None, **_: object) -> None:
    name = getattr(sender, "name", "a task")
    logger.warning("task %s[%s] will run again: %s", name, getattr(request, "id", "?"), reason)


def send_central(name: str, *args: object) -> None:
    """Queue a central task by name, with a short publish retry (callers may be web requests)."""
    app.send_task(name, args=list(args), retry=True, retry_policy=SEND_RETRY_POLICY)
