"""The agent's probe: read this host with gpuadmin.probe, send the snapshot, signed with
this agent's key, to central: in full, or as an update of the last full one when only figures
moved (``snapshot_choice``).

Runs on a GPU host's own queue (``host.<name>``). It needs the broker and
nothing else: it never opens the database, so a GPU host holds no database
credentials (an agent with an unreachable DATABASE_URL still delivers).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from celery import bootsteps
from django.conf import settings

from gpuadmin.agent.snapshot_choice import Choice, Limits, choose
from gpuadmin.celery import app, host_queue
from gpuadmin.data_dir import AGENT_SNAPSHOT_STATE
from gpuadmin.keys import agent_signing_key
from gpuadmin.probe.budget import seal_snapshot
from gpuadmin.sending import request_probe, send_snapshot, send_snapshot_update
from gpuadmin.wire.signing import MessageKind, fingerprint
from gpuadmin.wire.task_names import PROBE_HOST

logger = logging.getLogger(__name__)


def signed_snapshot(host_name: str) -> dict[str, Any]:
    """One snapshot of this host, signed with this agent's key; options from GPUADMIN_* variables.

    Cut to fit GPUADMIN_SNAPSHOT_MAX_BYTES as sent (the same variable and default
    as central's limit): a snapshot over it would be rejected and the host would
    drop off the panel, so what does not fit is left out and counted instead.
    """
    # Imported here so that loading the task modules (central imports them too)
    # does not load psutil and the GPU backends.
    from gpuadmin.probe import take_snapshot
    from gpuadmin.probe.config import ProbeConfig

    snapshot = take_snapshot(ProbeConfig.from_env(host_name=host_name))
    return seal_snapshot(snapshot, agent_signing_key(), max_bytes=settings.GPUADMIN_SNAPSHOT_MAX_BYTES)


def update_limits() -> Limits:
    return Limits(full_every_seconds=settings.GPUADMIN_FULL_SNAPSHOT_SECONDS,
                  snapshot_max_bytes=settings.GPUADMIN_SNAPSHOT_MAX_BYTES,
                  update_max_bytes=settings.GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES,
                  step_bytes=settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES)


def chosen_message(host_name: str, *, full: bool = False) -> Choice:
    """This probe's signed message: a full snapshot or an update (``snapshot_choice.choose``)."""
    from gpuadmin.probe import take_snapshot
    from gpuadmin.probe.config import ProbeConfig

    document = take_snapshot(ProbeConfig.from_env(host_name=host_name))
    return choose(document, agent_signing_key(), state_path=Path(settings.DATA_DIR) / AGENT_SNAPSHOT_STATE,
                  now=time.time(), limits=update_limits(), full_requested=full)


def probe_and_send(*, full: bool = False) -> Choice:
    """Probe this host and send the signed snapshot or update to central; returns what was sent."""
    choice = chosen_message(settings.GPUADMIN_HOST_NAME, full=full)
    if choice.kind is MessageKind.SNAPSHOT_UPDATE:
        send_snapshot_update(choice.message)
    else:
        send_snapshot(choice.message)
    return choice


@app.task(name=PROBE_HOST, ignore_result=True)
def probe_host(full: bool = False) -> int:
    """``full``: central asks for a full snapshot (it could not apply this host's last update)."""
    choice = probe_and_send(full=full)
    size_bytes = len(choice.message["text"])  # ASCII: characters are bytes
    logger.info("sent a %s of %s (%d bytes%s)", choice.kind.value.replace("_", " "),
                settings.GPUADMIN_HOST_NAME, size_bytes, f"; full: {choice.reason}" if choice.reason else "")
    return size_bytes


class ProbeClock(bootsteps.StartStopStep):
    """The agent's own probe clock: a probe as its consumer starts, then one every
    ``GPUADMIN_PROBE_INTERVAL_SECONDS``.

    The host decides when it is probed, not central: a central that falls behind (a scheduler's
    round queued behind the snapshots it is ingesting) would otherwise ask for fewer, and the fleet
    would go quiet, then all come back at once. Each request goes through this host's own queue
    (``request_probe``), so the probe runs in the worker's pool like "probe now" and central's asks
    for a full snapshot, and expires there after one interval when the pool is busy. The consumer
    starts again after a lost broker: the host shows up at once when it comes back.
    """

    label = "probe clock"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.timer_entry: Any = None
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        if c.app is not app:
            return
        host_name = settings.GPUADMIN_HOST_NAME
        if host_queue(host_name) not in {queue.name for queue in c.task_consumer.queues}:
            return  # a central-only worker: it has no host to probe
        key = agent_signing_key()  # made now on the first start, and its fingerprint logged
        logger.info("agent %s signs with key %s; probing every %s s", host_name, fingerprint(key),
                    settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
        self.ask(host_name)
        self.timer_entry = c.timer.call_repeatedly(settings.GPUADMIN_PROBE_INTERVAL_SECONDS, self.ask,
                                                   (host_name,))

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    shutdown = stop

    @staticmethod
    def ask(host_name: str) -> None:
        try:
            request_probe(host_name)
        except Exception:
            # The broker away: the consumer notices it itself and starts again (and this clock with
            # it); a missed tick is one probe fewer, never a stopped clock.
            logger.exception("could not ask this host (%s) for its probe", host_name)


app.steps["consumer"].add(ProbeClock)
