"""A fleet in real time through the production path (issue 36): N hosts every interval for M minutes.

Starts a throwaway PostgreSQL and redis-server (tests/services.py), central's worker as deployed
(``celery -A gpuadmin worker -Q central --concurrency W``: the production app and tasks, a prefork pool
of ``--workers`` processes; ``--pool solo``: ``--workers`` workers, each running its tasks in its own
process, no pool) and, unless ``--no-scheduler``, central's beat (``celery -A gpuadmin
beat``: the kill sweeper, history upkeep every 5 minutes; probes are the agents' own, on their
clocks, which the senders keep). Then:

1. enrolment: every host's key accepted before it sends anything, as ``manage.py accept_host NAME
   --public-key KEY`` does (``trust.accept_host``, one audit event each), timed; then each host's
   first full snapshot through the broker and the workers (the clock not started), timed until
   ingested. Each host's full-snapshot timer is started at a different phase, as agents started at
   different moments have them, so the every-``GPUADMIN_FULL_SNAPSHOT_SECONDS`` full snapshots
   spread over the rounds instead of coming all in one;
2. the run: ``--senders`` processes, forked from this one, each with its share of the hosts, send what
   each host's agent would, paced by the wall clock (host i's slot is i/N of the way into each
   interval): the message chosen by ``gpuadmin.agent.snapshot_choice.choose`` (a full snapshot when
   the processes changed, when central asked for one, or on the timer; else a signed update),
   published by ``gpuadmin.sending`` exactly as the agent publishes it. Before each round a sender
   takes central's probe requests for its hosts off their queues (what their agents would consume:
   "probe now", an ask for a full snapshot), and one asking for a full snapshot makes the host's
   next message one;
3. the change model (this script, over ``gpuadmin.fleet.synthetic``'s hosts, whose figures already
   move a little each round): each round about ``--job-change-percent`` % of hosts start or end a
   job (one launcher and its workers vanish, or come back as new processes: a full snapshot); one host
   in 50 gathers zombies (one more every minute: a full snapshot then), one in 50 leaks GPU memory
   (32 MiB a round on one process: updates that carry it, history points past the step).

Every ``--sample-seconds`` it prints messages/s sent (full and update apart) and ingested (stored, by
PostgreSQL's count of writes to the hosts' latest rows, one per message, or refused), the backlog (the
``central`` queue's length and what the worker reserved), the senders' lag behind their slots, and the
CPU of the central worker and of PostgreSQL over that window per message. At the end, over the whole
run until the queue drained: messages sent per kind, stored, refused and neither (expired in the
queue), asks for full snapshots, CPU per message of the central worker (pool and main process) and of
PostgreSQL (every process of its server but this script's own backend, the exited ones included: from their
parents' /proc counters of waited-for children), the senders' own CPU (the agents' work, reported
apart), the update batches from the worker's log (its update_batches lines at INFO: batches, updates
done in them, offers of updates that waited for their base again), history bytes per host-day, and
(unless ``--skip-pages``) the fleet pages' p50/p95 through
``django.test.Client`` (``benchmarks/fleet.py``'s timing).

Shortcuts in the senders (agent work, not central's): a host's shape digest
(``snapshot_update.shape_digest``, 1.3 ms of a 200-process document) is computed once per shape the
change model gives it and remembered, since the model knows when the shape changes, and each command
line's digest once; ``--exact-agents`` computes both every probe. What central receives is the same
either way. The senders share the machine with central: their CPU (printed) is what a real fleet's
agents spend on their own hosts, and at 10,000 hosts on two cores it competes with central's.

``--backlog``: the senders queue every round as fast as they can (each message taken at its slot on the
fleet's clock, so the full-snapshot timers fire as often) while central's worker and its pool are stopped
(SIGSTOP), with no beat; then the worker goes on and the drain is measured. A fleet's rate fills every
batch that way, which the senders cannot send live beside central on a small machine. The two queues
then drain at their own pace: an update whose full snapshot is still queued waits for it
(``fleet.update_batches``: up to six probe intervals while ``central`` holds messages; then it is
refused and its host asked for a full snapshot, and the host's next update of that base, after its own
wait, as a gap), and one that its host's next full snapshot overtook is refused as late; none of these
fails a run with ``--backlog``.

``--replay``: the fleet's rate live, which the senders cannot produce beside central on a small machine.
The senders first queue every round as fast as they can, each into a broker database of its own (1,
2, ...: central's is 0, where nothing reaches it meanwhile), writing down each message's slot, each
taken at its moment on a clock that starts once they are made (``REPLAY_MAKING_MS_PER_MESSAGE``: the
run waits for it; meanwhile beat's upkeep is caught up and the hosts' usage settlings spread over their
period, as a fleet in its steady state has them); then a pacer process moves each message to central's
queue at its slot (``PACER_TICK_SECONDS``), both queues in step as agents send them, while central runs as
deployed, its beat started with the replay (the pacer takes the probe requests, as the agents would; a
full snapshot asked for is not sent: the rounds are already made). The windows' "sent" is what the pacer
moved, the CPU it and the senders spent is printed apart, and a run is judged as a live one (no refusal
expected).

Exit status 1 when the queue did not drain within ``--drain-seconds`` after the last round, a sender or
publish failed, a message was refused or expired in the queue, or the backlog passed ``--max-backlog``
messages or redis-server ``--max-broker-mib`` (the senders are then stopped: a fleet that ingest cannot
keep up with would otherwise fill the machine's memory); the CPU requirement (issue 36: < 1.5 ms per
message, ingest and database) is printed, not enforced: it moves with the machine's load.

    python benchmarks/fleet_soak.py [--hosts 10000] [--minutes 10] [--interval-seconds 10] [--workers 2]
                                    [--pool prefork|solo] [--senders 2] [--gpus 8] [--processes 200]
                                    [--job-change-percent 1] [--sample-seconds 10] [--drain-seconds 600]
                                    [--max-backlog 50000] [--max-broker-mib 2048] [--repeats 20]
                                    [--no-scheduler] [--backlog] [--skip-pages] [--exact-agents]
                                    [--postgres-setting NAME=VALUE ...] [--no-wait]
                                    [--replay [--replay-making-ms 1.7]] [--logs DIR]
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import logging
import multiprocessing
import operator
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import setup_django, throwaway_data_dir  # noqa: E402
from benchmarks.snapshot_updates import history_bytes  # noqa: E402
from tests.services import postgres_server, redis_server  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT_SECONDS = 120
CPU_PER_MESSAGE_REQUIRED_MS = 1.5  # issue 36: ingest and database, averaged over the run
# A backend reports its statistics at most once a second while busy, within 10 s once idle, and as it
# exits: once central's have gone, a count that held for a poll has them all.
STATS_POLL_SECONDS, STATS_SETTLE_TIMEOUT_SECONDS = 0.5, 60
# The change model (see the docstring).
ZOMBIE_HOST_EVERY, ZOMBIE_HOST_OFFSET = 50, 7
LEAK_HOST_EVERY, LEAK_HOST_OFFSET = 50, 13
ZOMBIE_EVERY_SECONDS = 60
LEAK_BYTES_PER_ROUND = 32 * 2**20
CHANGING_LAUNCHER = 1  # the job that ends and starts again: DemoHost's second launcher
ZOMBIE_PARENT_PID = 33_000
# Enrolment's first full snapshots wait while this many messages do (135 kB each), checked every so many.
WARM_UP_BACKLOG, WARM_UP_CHECK_EVERY = 200, 20
# Enrolment fails when no first full snapshot was stored for this long.
WARM_UP_STALL_SECONDS = 180
# --replay: how often the pacer moves what is due to central's queues.
PACER_TICK_SECONDS = 0.05
# --replay: how long the two senders take to make a message on this 2-core machine (10,000 hosts: 600,000
# in 15-21 minutes), from which the replay's clock is set ahead: the rounds are taken at their moments on it,
# so that central receives each at its moment, as from a fleet in real time. Set low: rounds made sooner
# wait for it, later ones lag it by the overrun (printed; a lag under the history's 5-minute buckets
# changes nothing of what beat's upkeep finds to do).
REPLAY_MAKING_MS_PER_MESSAGE = 1.7
# What central says of an update overtaken by its host's next full snapshot (fleet.intake.updates).
LATE_UPDATE = "is not newer than the latest snapshot"
# What --backlog's two queues draining at their own pace may refuse (gpuadmin/fleet/intake/updates.py's
# words): late, superseded by a full snapshot that overtook it; of a base still queued past the wait; the
# same base's next update after that one.
BACKLOG_REFUSALS = (LATE_UPDATE, "update of an unknown base", "of this base are missing")
BATCH_LINE = re.compile(r"applied a batch of (\d+) snapshot updates(?:; (\d+) wait for their base)?")
# A task's end in a worker's log at INFO (Celery's own line): its name, seconds, and what it returned.
TASK_LINE = re.compile(r"Task (gpuadmin\.[\w.]+)\[[^\]]+\] succeeded in ([0-9.]+)s: (.*)")
# Beat's tasks that took at least this long are named in the report: the upkeep a window's CPU includes.
LONG_TASK_SECONDS = 1.0
# --backlog: the messages' expiry, in probe intervals (a day of 10 s intervals).
BACKLOG_OFFLINE_AFTER_INTERVALS = 8640
# Sender counters, one array per sender: what it sent, what it saw, how late it ran.
FULL, UPDATE, FULL_ASKS, PROBES, LAG_MS, ERRORS, ROUND, CPU_MS = range(8)
FIELDS = 8


# --- CPU from /proc ----------------------------------------------------------------------------------


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def own_cpu_seconds(pid: int) -> float:
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid``, of its children it has waited for (exited backends, replaced pool
    processes), and of its live children: a counter that only grows while ``pid`` lives."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    total = sum(int(value) for value in fields[11:15]) / CLOCK_TICKS
    for child in processes.children_of(pid):
        child_fields = _stat(child)
        if child_fields is not None:
            total += sum(int(value) for value in child_fields[11:15]) / CLOCK_TICKS
    return total


@dataclass
class CpuSample:
    worker: float  # the worker's main process and its pool
    worker_main: float
    database: float  # every PostgreSQL process but this script's own backend
    beat: float
    at: float = field(default_factory=time.monotonic)


@dataclass
class DatabaseActivity:
    blocks_read: int  # from the kernel, not in shared buffers
    blocks_hit: int
    checkpoints: int
    autovacuums: int  # autovacuum and autoanalyze runs, every table

    def since(self, before: DatabaseActivity, messages: int) -> str:
        """The window's columns: blocks read per message, the share found in shared buffers,
        checkpoints and autovacuum runs."""
        read, hit = self.blocks_read - before.blocks_read, self.blocks_hit - before.blocks_hit
        per_message = f"{read / messages:.1f}" if messages else "-"
        share = f"{100 * hit / (read + hit):.1f}" if read + hit else "-"
        return (f"{per_message:>8}{share:>7}{self.checkpoints - before.checkpoints:>5}"
                f"{self.autovacuums - before.autovacuums:>5}")


@dataclass
class Central:
    workers: list[subprocess.Popen[Any]]
    beat: subprocess.Popen[Any] | None
    postmaster: int
    own_backend: int

    def stop(self) -> None:
        """Stop the workers and beat (idempotent: ``run`` stops them again on the way out)."""
        for worker in self.workers:
            processes.stop(worker, grace_seconds=30)
        if self.beat is not None:
            processes.stop(self.beat)

    def sample(self) -> CpuSample:
        return CpuSample(worker=sum(tree_cpu_seconds(w.pid) for w in self.workers),
                         worker_main=sum(own_cpu_seconds(w.pid) for w in self.workers),
                         database=tree_cpu_seconds(self.postmaster) - own_cpu_seconds(self.own_backend),
                         beat=tree_cpu_seconds(self.beat.pid) if self.beat else 0.0)


# --- the change model and the agents -----------------------------------------------------------------


@dataclass
class HostChange:
    """What the change model did to one host so far (kept by its sender)."""

    job_ended: bool = False
    generation: int = 0  # how many times its changing job started again

    def shape_key(self, zombies: int) -> tuple[bool, int, int]:
        return self.job_ended, self.generation, zombies


def zombie_count(index: int, seconds: float) -> int:
    if index % ZOMBIE_HOST_EVERY != ZOMBIE_HOST_OFFSET:
        return 0
    return 1 + int(seconds // ZOMBIE_EVERY_SECONDS)


def apply_changes(document: dict[str, Any], index: int, change: HostChange, *, round_number: int,
                  seconds: float) -> None:
    """The change model laid over a DemoHost document, in place; every GPU keeps at least as much memory
    used as its processes hold (``synthetic.memory_contradictions`` stays empty)."""
    used = {gpu["uuid"]: gpu for gpu in document["gpus"]}
    launcher_pid = 10_000 + CHANGING_LAUNCHER * 100
    if change.job_ended:
        kept = []
        for process in document["processes"]:
            if process["pid"] == launcher_pid or process["ppid"] == launcher_pid:
                for uuid, held in process["gpu_memory_bytes"].items():
                    used[uuid]["memory_used_bytes"] -= held or 0
            else:
                kept.append(process)
        removed = len(document["processes"]) - len(kept)
        document["processes"] = kept
        document["process_counts"]["total"] -= removed
        document["host"]["pids_in_use"] -= removed
    elif change.generation:
        # The job started again: new processes (other PIDs every other time, later start times).
        shift = 50 * (change.generation % 2)
        for process in document["processes"]:
            if process["pid"] == launcher_pid or process["ppid"] == launcher_pid:
                if process["ppid"] == launcher_pid:
                    process["ppid"] += shift
                process["pid"] += shift
                process["pgid"] = process["sid"] = launcher_pid + shift
                process["start_time_ticks"] += change.generation * 60 * 100
                process["elapsed_seconds"] = max(1.0, process["elapsed_seconds"] - change.generation * 60)
    add_zombies(document, zombie_count(index, seconds))
    if index % LEAK_HOST_EVERY == LEAK_HOST_OFFSET:
        leak(document, used, round_number)


def add_zombies(document: dict[str, Any], zombies: int) -> None:
    """A spawner that never reaps, with ``zombies`` zombie children."""
    if zombies:
        from gpuadmin.fleet.synthetic import proc

        document["processes"].append(proc(ZOMBIE_PARENT_PID, name="spawner", reasons=["ancestor"],
                                          cmdline=["spawner", "--forever"]))
        for n in range(zombies):
            document["processes"].append(proc(ZOMBIE_PARENT_PID + 1 + n, ppid=ZOMBIE_PARENT_PID, state="Z",
                                              name="worker", cmdline=[], reasons=["zombie"]))
        document["process_counts"]["total"] += zombies + 1
        document["process_counts"]["zombies"] += zombies
        document["host"]["pids_in_use"] += zombies + 1


def leak(document: dict[str, Any], gpus: dict[str, dict[str, Any]], round_number: int) -> None:
    """The first GPU-memory holder grows by LEAK_BYTES_PER_ROUND a round, its GPU's use with it (until the
    card is full)."""
    holder = next((p for p in document["processes"] if p["gpu_memory_bytes"]), None)
    if holder is not None:
        uuid = next(iter(holder["gpu_memory_bytes"]))
        gpu = gpus[uuid]
        room = gpu["memory_total_bytes"] - gpu["memory_used_bytes"]
        leaked = min(LEAK_BYTES_PER_ROUND * round_number, room)
        holder["gpu_memory_bytes"][uuid] += leaked
        gpu["memory_used_bytes"] += leaked


def maybe_change_job(name: str, change: HostChange, round_number: int, percent: float) -> None:
    rng = random.Random(f"job:{name}:{round_number}")
    if rng.random() * 100 < percent:
        if change.job_ended:
            change.job_ended, change.generation = False, change.generation + 1
        else:
            change.job_ended = True


@dataclass
class SenderPlan:
    hosts: list[Any]  # synthetic.DemoHost, this sender's share
    fleet_size: int
    interval_seconds: float
    rounds: int
    job_change_percent: float
    exact_agents: bool
    state_dir: Path
    unpaced: bool  # --backlog, --replay: the rounds sent as fast as they can be, on the fleet's clock
    # --replay: the broker database this sender queues its rounds in, and where it writes their slots
    staging_url: str | None = None
    slots_path: Path | None = None


def take_probe_requests(broker: Any, queues: list[str], counters: Any) -> set[str]:
    """Take what central sent to these hosts' queues, as their agents would (counted); the queues of
    those asked for a full snapshot."""
    pipe = broker.pipeline(transaction=False)
    for queue in queues:
        pipe.lpop(queue, 1000)
    asked = set()
    for queue, taken in zip(queues, pipe.execute(), strict=True):
        for raw in taken or ():
            counters[PROBES] += 1
            if b"'full': True" in raw:
                counters[FULL_ASKS] += 1
                asked.add(queue)
    return asked


def run_sender(plan: SenderPlan, counters: Any, start: Any, stop: Any) -> None:
    """One sender process: the first full snapshot of each of its hosts at once, then, once ``start``
    holds the clock's start, ``rounds`` rounds paced by the wall clock (``--backlog``, ``--replay``: not
    paced, each message taken at its slot on the fleet's clock)."""
    try:
        _send(plan, counters, start, stop)
    except (KeyboardInterrupt, SystemExit):
        pass  # this script stopping it (Ctrl+C, SIGTERM): no failure of its own
    except BaseException:
        counters[ERRORS] += 1
        traceback.print_exc()
        raise


def phase(period: float, index: int, fleet_size: int) -> float:
    """How far into ``period`` the host of ``index`` has its turn: the fleet's hosts spread over it."""
    return period * index / fleet_size


def rephase_full_timers(plan: SenderPlan, began: float, period: float) -> None:
    """Each host's full-snapshot timer at its phase of the period as the rounds begin: an enrolment of
    thousands of hosts takes minutes, and timers phased at their first snapshots would bring more of
    them due in the first rounds than a fleet in its steady state has (the agent's state file,
    ``snapshot_choice``'s: its ``full_at``)."""
    for host in plan.hosts:
        path = plan.state_dir / f"{host.name}.json"
        state = json.loads(path.read_text())
        if "full_at" not in state:
            raise RuntimeError(f"{path} has no full_at: snapshot_choice's state changed, and this with it")
        state["full_at"] = began - phase(period, host.index, plan.fleet_size)
        path.write_text(json.dumps(state))


def remembered_cmdline_digest(digest: Any) -> Any:
    """``synthetic.cmdline_sha256`` remembered per command line: a fleet's hosts run a few hundred."""
    known: dict[tuple[str, ...], str] = {}

    def remembered(argv: list[str]) -> str:
        key = tuple(argv)
        found = known.get(key)
        if found is None:
            found = known[key] = digest(argv)
        return found

    return remembered


def _send(plan: SenderPlan, counters: Any, start: Any, stop: Any) -> None:
    import redis
    from django.conf import settings

    from gpuadmin.agent import snapshot_choice
    from gpuadmin.agent.probing import update_limits
    from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, host_queue
    from gpuadmin.celery import app as current_app
    from gpuadmin.fleet import synthetic
    from gpuadmin.sending import send_snapshot, send_snapshot_update
    from gpuadmin.wire.signing import MessageKind

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    limits = update_limits()
    changes = {host.name: HostChange() for host in plan.hosts}
    shapes: dict[str, tuple[Any, str]] = {}
    real_shape_digest = snapshot_choice.shape_digest
    current: list[Any] = [None]  # (host name, shape key) of the document being chosen for

    def remembered_shape(document: dict[str, Any]) -> str:
        name, key = current[0]
        known = shapes.get(name)
        if known is None or known[0] != key:
            known = shapes[name] = (key, real_shape_digest(document))
        return known[1]

    if not plan.exact_agents:
        snapshot_choice.shape_digest = remembered_shape
        synthetic.cmdline_sha256 = remembered_cmdline_digest(synthetic.cmdline_sha256)
    full_asked: set[str] = set()

    # --replay: each round's message's second on the fleet's clock, by queue, in the order queued.
    slots: dict[str, list[float]] = {CENTRAL_QUEUE: [], CENTRAL_UPDATES_QUEUE: []}

    def send(host: Any, round_number: int, seconds: float, now: float, *, taken_at: float | None = None) \
            -> None:
        change = changes[host.name]
        moment = datetime.fromtimestamp(time.time() if taken_at is None else taken_at, UTC)
        document = host.document(round_number, taken_at=moment)
        apply_changes(document, host.index, change, round_number=round_number, seconds=seconds)
        current[0] = (host.name, change.shape_key(zombie_count(host.index, seconds)))
        choice = snapshot_choice.choose(document, host.key, state_path=plan.state_dir / f"{host.name}.json",
                                        now=now, limits=limits, full_requested=host.name in full_asked)
        full_asked.discard(host.name)
        if choice.kind is MessageKind.SNAPSHOT_UPDATE:
            send_snapshot_update(choice.message)
            counters[UPDATE] += 1
        else:
            send_snapshot(choice.message)
            counters[FULL] += 1
        if round_number:  # the enrolment's are not replayed
            queue = CENTRAL_UPDATES_QUEUE if choice.kind is MessageKind.SNAPSHOT_UPDATE else CENTRAL_QUEUE
            slots[queue].append(seconds)

    names = {host_queue(host.name): host.name for host in plan.hosts}
    queues = list(names)

    def take_probe_requests_for_agents() -> None:
        full_asked.update(names[queue] for queue in take_probe_requests(broker, queues, counters))

    def drain_probes_while(waiting: Any) -> bool:
        """Take the probe requests every interval while ``waiting()``; False when stopped meanwhile."""
        taken_at = 0.0
        while waiting():
            if time.monotonic() - taken_at >= plan.interval_seconds:
                take_probe_requests_for_agents()
                taken_at = time.monotonic()
            if stop.wait(0.05):
                return False
        return True

    # Enrolment's full snapshots, each host's timer started at its own phase of the full-snapshot period;
    # no faster than the worker takes them, so that redis-server never holds thousands of them.
    period = float(settings.GPUADMIN_FULL_SNAPSHOT_SECONDS)
    for n, host in enumerate(plan.hosts):
        if n % WARM_UP_CHECK_EVERY == 0 and not drain_probes_while(
                lambda: broker.llen(CENTRAL_QUEUE) > WARM_UP_BACKLOG):
            return
        if stop.is_set():
            return
        send(host, 0, 0.0, time.time() - phase(period, host.index, plan.fleet_size))
    counters[CPU_MS] = int(1000 * time.process_time())
    if not drain_probes_while(lambda: start.value == 0.0):
        return
    began = start.value
    rephase_full_timers(plan, began, period)
    if plan.staging_url is not None:
        # The rounds go to this sender's own broker database, the pacer's to replay (the enrolment's
        # full snapshots went to central's): Celery's pools are made again on the next send, from the
        # new URL, as they are in a forked child (app.close() leaves its producers' pool).
        current_app.conf.update(broker_url=plan.staging_url)
        current_app._after_fork()  # type: ignore[attr-defined]  # private to Celery: not in its stubs
    _send_rounds(plan, began, send=send, take_probe_requests=take_probe_requests_for_agents, changes=changes,
                 counters=counters, stop=stop)
    if plan.slots_path is not None:
        plan.slots_path.write_text(json.dumps(slots))


def _send_rounds(plan: SenderPlan, began: float, *, send: Callable[..., None],
                 take_probe_requests: Callable[[], None], changes: dict[str, HostChange], counters: Any,
                 stop: Any) -> None:
    """The rounds from the clock's start ``began``: ``send(host, round, seconds, now, taken_at=...)`` each
    host at its slot; its probe requests taken before each round (--replay: the pacer's)."""
    for round_number in range(1, plan.rounds + 1):
        if plan.staging_url is None:
            take_probe_requests()
        for host in plan.hosts:
            maybe_change_job(host.name, changes[host.name], round_number, plan.job_change_percent)
            slot = began + (round_number - 1) * plan.interval_seconds + phase(
                plan.interval_seconds, host.index, plan.fleet_size)
            if plan.unpaced:
                if stop.is_set():
                    return
                # Taken at its slot, never after now (--backlog: central refuses a moment ahead of its
                # clock, which rounds made faster than the fleet's clock would otherwise carry); --replay:
                # at its slot, which the pacer then sends at.
                send(host, round_number, slot - began, slot,
                     taken_at=min(slot, time.time()) if plan.staging_url is None else slot)
                continue
            wait = slot - time.time()
            if wait > 0 and stop.wait(wait):
                return
            if stop.is_set():
                return
            counters[LAG_MS] = max(counters[LAG_MS], int(1000 * max(0.0, time.time() - slot)))
            send(host, round_number, time.time() - began, time.time())
        counters[ROUND] = round_number
        counters[CPU_MS] = int(1000 * time.process_time())


# --- the replay -------------------------------------------------------------------------------------


@dataclass
class PacerPlan:
    """--replay: what the senders queued in their own broker databases, moved to central's at its slots."""

    broker_url: str  # central's
    staging_urls: list[str]  # one per sender
    slots_paths: list[Path]  # one per sender: SenderPlan.slots_path
    host_queues: list[str]  # the hosts' probe-request queues, taken as their agents would
    interval_seconds: float


class Stream:
    """One sender's queued messages of one queue, and their seconds on the fleet's clock in that order."""

    def __init__(self, staging: Any, queue: str, seconds: list[float]) -> None:
        self.staging, self.queue, self.seconds = staging, queue, seconds
        self.moved = 0

    def due(self, now_seconds: float) -> int:
        """How many are due by ``now_seconds`` and not moved yet."""
        return bisect.bisect_right(self.seconds, now_seconds) - self.moved

    def __len__(self) -> int:
        return len(self.seconds)


def run_pacer(plan: PacerPlan, counters: Any, start: Any, stop: Any) -> None:
    """Once ``start`` holds the clock's start, every ``PACER_TICK_SECONDS`` move the messages due by then
    from the senders' databases to central's queues (oldest first, each queue's order kept), and take
    the hosts' probe requests every interval; ends once all are moved."""
    try:
        _pace(plan, counters, start, stop)
    except (KeyboardInterrupt, SystemExit):
        pass
    except BaseException:
        counters[ERRORS] += 1
        traceback.print_exc()
        raise


def _pace(plan: PacerPlan, counters: Any, start: Any, stop: Any) -> None:
    import redis

    from gpuadmin.celery import CENTRAL_QUEUE

    central = redis.Redis.from_url(plan.broker_url)
    while start.value == 0.0:  # the senders are done by then, their slots written
        if stop.wait(PACER_TICK_SECONDS):
            return
    streams = []
    for url, path in zip(plan.staging_urls, plan.slots_paths, strict=True):
        staging = redis.Redis.from_url(url)
        for queue, seconds in json.loads(path.read_text()).items():
            if int(staging.llen(queue)) != len(seconds):
                raise RuntimeError(f"{url} holds {staging.llen(queue)} messages in {queue}, its sender "
                                   f"wrote {len(seconds)} slots")
            streams.append(Stream(staging, queue, seconds))
    kind = {CENTRAL_QUEUE: FULL}
    began, probes_taken_at = start.value, 0.0
    while any(stream.moved < len(stream) for stream in streams):
        if stop.wait(PACER_TICK_SECONDS):
            return
        now_seconds = time.time() - began
        for stream in streams:
            due = stream.due(now_seconds)
            if due > 0:
                moved = stream.staging.rpop(stream.queue, due)  # the oldest, oldest first
                central.lpush(stream.queue, *moved)  # the oldest in first: the worker takes from the right
                stream.moved += len(moved)
                counters[kind.get(stream.queue, UPDATE)] += len(moved)
        counters[LAG_MS] = max(counters[LAG_MS], int(1000 * (time.time() - began - now_seconds)))
        if time.monotonic() - probes_taken_at >= plan.interval_seconds:
            take_probe_requests(central, plan.host_queues, counters)
            probes_taken_at = time.monotonic()
        counters[CPU_MS] = int(1000 * time.process_time())


# --- central ----------------------------------------------------------------------------------------


def celery(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[Any]:
    with log.open("ab") as out:
        return processes.spawn([sys.executable, "-m", "celery", "-A", "gpuadmin", *args], cwd=REPO, env=env,
                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def wait_for_line(log: Path, text: str, process: subprocess.Popen[Any], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start:\n{log_tail(log)}")
        time.sleep(0.2)


def log_tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def wait_for_first_snapshots(soak: Soak) -> float:
    """Seconds until every host's first full snapshot was stored; fails when none is for a while."""
    from gpuadmin.fleet.models import LatestSnapshot

    began = progressed = time.perf_counter()
    stored = 0
    while stored < len(soak.hosts):
        soak.check_senders()
        time.sleep(0.5)
        now = LatestSnapshot.objects.count()
        if now > stored:
            stored, progressed = now, time.perf_counter()
        elif time.perf_counter() - progressed > WARM_UP_STALL_SECONDS:
            raise RuntimeError(f"no first full snapshot stored for {WARM_UP_STALL_SECONDS} s "
                               f"({stored} of {len(soak.hosts)}): see the worker's log")
    return time.perf_counter() - began


def postmaster_pid(database: Any) -> int:
    return int((database.socket_dir.parent / "data" / "postmaster.pid").read_text().split()[0])


def totals(counters: list[Any]) -> list[int]:
    return [max(c[n] for c in counters) if n == LAG_MS else sum(c[n] for c in counters)
            for n in range(FIELDS)]


def per_message_ms(seconds: float, messages: int) -> str:
    return f"{1000 * seconds / messages:.2f}" if messages else "-"


@dataclass
class Soak:
    """What the run's parts share once central and the senders are up."""

    args: argparse.Namespace
    rounds: int
    hosts: list[Any]
    broker: Any  # redis.Redis
    senders: list[Any]  # multiprocessing.Process
    counters: list[Any]  # one multiprocessing.Array per sender
    start: Any  # multiprocessing.Value: the clock's start, 0 until then
    stop: Any  # multiprocessing.Event
    worker_logs: list[Path]
    state_dir: Path  # the agents' state files (snapshot_choice's), one per host
    # --replay: the pacer (process, counters, start), which takes the senders' place once they are done
    pacer: tuple[Any, Any, Any] | None = None
    agents_cpu_seconds: float | None = None  # --replay: the senders', once the pacer took their place

    def sent(self) -> list[int]:
        return totals(self.counters)

    def queued(self) -> int:
        """Messages not yet taken by the worker: in the queues (snapshot updates have their own), or
        reserved and not yet acknowledged (the worker acknowledges a task as it starts it, a snapshot
        update once applied)."""
        from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE

        return (int(self.broker.llen(CENTRAL_QUEUE)) + int(self.broker.llen(CENTRAL_UPDATES_QUEUE))
                + int(self.broker.hlen("unacked")))

    def stored(self) -> int:
        """Messages stored so far, full snapshots and applied updates: each writes its host's latest row
        once (an upsert, or an update), as PostgreSQL's statistics count them (each backend reports
        within seconds of its transactions)."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables "
                           "WHERE relname = 'fleet_latestsnapshot'")
            return int(cursor.fetchone()[0])

    def refused(self) -> int:
        from gpuadmin.fleet.models import SnapshotRejection

        return SnapshotRejection.objects.count()

    def settled_stored(self) -> int:
        """``stored()`` once central's processes were stopped (``Central.stop``): when no other backend
        is left and the count held for a poll (an exiting backend reports just after it leaves
        pg_stat_activity)."""
        from django.db import connection

        deadline, last = time.monotonic() + STATS_SETTLE_TIMEOUT_SECONDS, -1
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                               "AND pid <> pg_backend_pid()")
                others = int(cursor.fetchone()[0])
            now = self.stored()
            if not others and now == last:
                return now
            last = now
            time.sleep(STATS_POLL_SECONDS)
        raise RuntimeError(f"central's database connections were still open {STATS_SETTLE_TIMEOUT_SECONDS} s "
                           "after its processes stopped")

    def database_activity(self) -> DatabaseActivity:
        """What PostgreSQL did so far beyond the statements: pages read from outside its shared buffers,
        checkpoints, autovacuum runs (whose CPU the database's figure includes)."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT blks_read, blks_hit FROM pg_stat_database "
                           "WHERE datname = current_database()")
            read, hit = cursor.fetchone()
            cursor.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
            (checkpoints,) = cursor.fetchone()
            cursor.execute("SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) "
                           "FROM pg_stat_all_tables")
            (autovacuums,) = cursor.fetchone()
        return DatabaseActivity(int(read), int(hit), int(checkpoints), int(autovacuums))

    def check_senders(self) -> None:
        for sender, counter in zip(self.senders, self.counters, strict=True):
            if counter[ERRORS] or sender.exitcode not in (None, 0):
                raise RuntimeError(f"a sender failed (exit status {sender.exitcode})")

    def senders_cpu_seconds(self) -> float:
        """The senders' CPU (the agents' work); with --replay, once it began, the pacer's."""
        return sum(c[CPU_MS] for c in self.counters) / 1000

    def update_offers(self) -> tuple[int, int, int]:
        """From the workers' logs (update_batches.FLUSH_LOG): batches, updates done in them, and offers
        of updates that waited for their base (each wait is one more offer of the same message)."""
        batches = done = waited = 0
        for log in self.worker_logs:
            for found in BATCH_LINE.finditer(log.read_text(errors="replace")):
                batches += 1
                done += int(found.group(1))
                waited += int(found.group(2) or 0)
        return batches, done, waited

    def long_tasks(self) -> list[tuple[str, float, str]]:
        """From the workers' logs: the tasks other than ingest's that ran ``LONG_TASK_SECONDS`` or more
        (beat's upkeep), each with its seconds and what it returned."""
        from gpuadmin.wire import task_names

        found = []
        for log in self.worker_logs:
            for name, seconds, returned in TASK_LINE.findall(log.read_text(errors="replace")):
                if name != task_names.INGEST_SNAPSHOT and float(seconds) >= LONG_TASK_SECONDS:
                    found.append((name, float(seconds), returned))
        return found

    def hosts_current(self) -> int:
        """Hosts whose latest stored message is the last their agent sent: its full snapshot and as many
        updates of it as the agent's state file counts."""
        from gpuadmin.fleet.models import LatestSnapshot

        stored = {name: (base, sequence) for name, base, sequence in LatestSnapshot.objects.values_list(
            "host__name", "base_digest", "update_sequence")}
        current = 0
        for path in self.state_dir.glob("*.json"):
            state = json.loads(path.read_text())
            current += stored.get(path.stem) == (state["base"], state["sequence"])
        return current

    def arrival_lags(self) -> tuple[float, float]:
        """Seconds from each host's latest stored message's moment to central's receiving it (its row's
        ``last_seen_at``): the median and the largest."""
        from gpuadmin.fleet.models import Host

        hosts = Host.objects.filter(name__in=[host.name for host in self.hosts])
        lags = sorted((seen - taken).total_seconds()
                      for seen, taken in hosts.values_list("last_seen_at", "last_snapshot_taken_at"))
        return (lags[len(lags) // 2], lags[-1]) if lags else (0.0, 0.0)

    def worker_errors(self) -> list[str]:
        """The workers' error lines; a traceback as the line before it, then its last line (the error)."""
        errors = []
        for log in self.worker_logs:
            lines = log.read_text(errors="replace").splitlines()
            for number, line in enumerate(lines):
                if "ERROR" in line or "CRITICAL" in line:
                    errors.append(line)
                elif line.startswith("Traceback"):
                    end = next((n for n in range(number + 1, len(lines)) if not lines[n].startswith(" ")),
                               len(lines) - 1)
                    before = lines[number - 1] if number else ""
                    errors.append(f"{before[:300]} / Traceback ... {lines[end][:300]}")
        return errors


# --- the run ----------------------------------------------------------------------------------------


def soak(args: argparse.Namespace, work: Path) -> int:
    with postgres_server(args.postgres_setting) as database, redis_server() as broker_server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUADMIN_", "COVERAGE_"))}
        env.update({"DATABASE_URL": database.url, "REDIS_URL": broker_server.url,
                    "GPUADMIN_DATA_DIR": os.environ["GPUADMIN_DATA_DIR"],
                    "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
                    "GPUADMIN_PROBE_INTERVAL": str(int(args.interval_seconds)), "PYTHONUNBUFFERED": "1",
                    # A line per batch of updates (update_offers) and per task: a few hundred a second.
                    "GPUADMIN_TASK_LOG_LEVEL": "INFO"})
        for name in ("GPUADMIN_FULL_SNAPSHOT_SECONDS", "GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES"):
            if name in os.environ:
                env[name] = os.environ[name]
        os.environ.update({k: env[k] for k in ("REDIS_URL", "GPUADMIN_PROBE_INTERVAL")})
        setup_django(database.url)
        return run(args, work, env, database, broker_server)


def run(args: argparse.Namespace, work: Path, env: dict[str, str], database: Any, broker_server: Any) -> int:
    import redis
    from django.conf import settings
    from django.db import connection, connections

    from benchmarks.fleet import database_server_pid
    from gpuadmin.fleet import synthetic
    from gpuadmin.fleet.intake import trust
    from gpuadmin.wire.signing import public_key_text

    logging.disable(logging.WARNING)
    rounds = max(1, round(args.minutes * 60 / args.interval_seconds))
    how = ("; every round queued, then drained" if args.backlog
           else "; every round queued aside, then sent at the fleet's pace" if args.replay else "")
    print(f"== {args.hosts} hosts x {args.gpus} GPUs, {args.processes} processes each, every "
          f"{args.interval_seconds:g} s for {rounds} rounds; central: {args.workers} {args.pool} worker "
          f"processes{'' if args.no_scheduler or args.backlog else ' and beat'}; {args.senders} senders; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; full snapshot at least every "
          f"{settings.GPUADMIN_FULL_SNAPSHOT_SECONDS} s{how} ==", flush=True)
    if args.backlog or args.replay:
        # Every message waits in the queue while the rest are sent: none may expire meanwhile
        # (sending.snapshot_expiry_seconds, in the senders forked from this process).
        settings.GPUADMIN_OFFLINE_AFTER_INTERVALS = BACKLOG_OFFLINE_AFTER_INTERVALS
    # As deploy/gpuadmin-worker.service starts it: one worker, a prefork pool; or (--pool solo) as many
    # workers as processes, each running its tasks itself.
    common = ["-Q", "central", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    if args.pool == "prefork":
        starts = [["worker", "-n", "central@%h", "--concurrency", str(args.workers), *common]]
    else:
        starts = [["worker", "-n", f"central{n}@%h", "--pool", "solo", *common] for n in range(args.workers)]
    worker_logs = [work / f"worker{n}.log" for n in range(len(starts))]
    workers = [celery(argv, env, log) for argv, log in zip(starts, worker_logs, strict=True)]
    beats: list[subprocess.Popen[Any]] = []

    def start_beat() -> subprocess.Popen[Any]:
        beats.append(celery(["beat", "--loglevel", "INFO"], env, work / "beat.log"))
        return beats[-1]

    # --replay starts it with the replay, so that its periodic tasks run on the replay's clock.
    beat = None if args.no_scheduler or args.backlog or args.replay else start_beat()
    senders: list[Any] = []
    forked: list[Any] = []  # the senders and the pacer, stopped on the way out
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    state_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
    states = Path(tempfile.mkdtemp(prefix="gpuadmin-soak-agents-", dir=state_root))
    try:
        for worker, log in zip(workers, worker_logs, strict=True):
            wait_for_line(log, " ready.", worker, "a central worker")
        hosts = synthetic.demo_hosts(settings.DATA_DIR, args.hosts, gpus=args.gpus, processes=args.processes)
        began = time.perf_counter()
        for host in hosts:
            trust.accept_host(host.name, actor_name="fleet soak", public_key=public_key_text(host.key),
                              ask_for_snapshot=False)
        print(f"enrolment, keys accepted (trust.accept_host, audited): {len(hosts)} in "
              f"{time.perf_counter() - began:.1f} s", flush=True)
        connections.close_all()  # the senders are forked: none may share this process's connection
        start = context.Value("d", 0.0)
        counters = [context.Array("q", FIELDS) for _ in range(args.senders)]
        # --replay: each sender's rounds queued in a broker database of its own (1, 2, ...; central's is 0)
        staging = [f"{broker_server.url.rsplit('/', 1)[0]}/{n + 1}" for n in range(args.senders)]
        slots = [work / f"replay-slots-{n}.json" for n in range(args.senders)]
        for n in range(args.senders):
            plan = SenderPlan(hosts[n::args.senders], len(hosts), args.interval_seconds, rounds,
                              args.job_change_percent, args.exact_agents, states, args.backlog or args.replay,
                              *((staging[n], slots[n]) if args.replay else ()))
            senders.append(context.Process(target=run_sender, args=(plan, counters[n], start, stop)))
        pacer = None
        if args.replay:
            from gpuadmin.celery import host_queue

            pacer_plan = PacerPlan(broker_server.url, staging, slots, [host_queue(h.name) for h in hosts],
                                   args.interval_seconds)
            pacer_counters, pacer_start = context.Array("q", FIELDS), context.Value("d", 0.0)
            pacer = (context.Process(target=run_pacer, args=(pacer_plan, pacer_counters, pacer_start, stop)),
                     pacer_counters, pacer_start)
        forked += [*senders, *([pacer[0]] if pacer else [])]
        for process in forked:
            process.start()
        state = Soak(args, rounds, hosts, redis.Redis.from_url(broker_server.url), list(senders), counters,
                     start, stop, worker_logs, states, pacer)
        central = Central(workers, beat, postmaster_pid(database), database_server_pid() or 0)
        before = central.sample()
        first = wait_for_first_snapshots(state)
        enrolled = central.sample()
        # The full snapshots' path alone (through the broker, the worker's task, PostgreSQL): the rounds
        # after it mix them with updates.
        print(f"enrolment, first full snapshots through the broker and the worker: {len(hosts)} in "
              f"{first:.1f} s ({len(hosts) / first:.0f}/s); CPU per snapshot: worker "
              f"{1000 * (enrolled.worker - before.worker) / len(hosts):.2f} ms, PostgreSQL "
              f"{1000 * (enrolled.database - before.database) / len(hosts):.2f} ms", flush=True)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # as autovacuum would soon after: the tables have just filled
        return measure(state, central, start_beat=None if args.no_scheduler else start_beat)
    finally:
        stop.set()
        for process in forked:
            process.join(timeout=30)
        shutil.rmtree(states, ignore_errors=True)
        for worker in workers:
            processes.stop(worker, grace_seconds=30)
        for beat in beats:
            processes.stop(beat)
        keep_logs(work, args.logs)


def keep_logs(work: Path, into: Path | None) -> None:
    """--logs: the workers' and beat's logs copied out of the run's folder, which goes."""
    if into is not None:
        into.mkdir(parents=True, exist_ok=True)
        for log in work.glob("*.log"):
            shutil.copy(log, into)


@dataclass
class Sampled:
    """How the rounds ended."""

    drained_at: float | None = None
    interrupted: bool = False
    gave_up: bool = False  # the senders stopped at --max-backlog or --max-broker-mib
    peak_backlog: int = 0


def sample_rounds(soak: Soak, central: Central, clock: float, *, sent_before: list[int], done_before: int,
                  cpu_before: CpuSample) -> Sampled:
    """A line every ``--sample-seconds`` from the clock's start until the queue drained after the rounds
    (or ``--drain-seconds`` passed, or Ctrl+C)."""
    args = soak.args
    last_sent, last_done, last_cpu = sent_before, done_before, cpu_before
    last_activity = soak.database_activity()
    last_round_at = clock + soak.rounds * args.interval_seconds
    run = Sampled()
    try:
        while True:
            time.sleep(max(0.0, args.sample_seconds - (time.monotonic() - last_cpu.at)))
            soak.check_senders()
            sent, queued, cpu = soak.sent(), soak.queued(), central.sample()
            done, activity = soak.stored() + soak.refused(), soak.database_activity()
            window, new = cpu.at - last_cpu.at, done - last_done
            print(f"{time.time() - clock:6.0f}{(sent[FULL] - last_sent[FULL]) / window:12.1f}"
                  f"{(sent[UPDATE] - last_sent[UPDATE]) / window:10.1f}{new / window:11.1f}{queued:9}"
                  f"{sent[LAG_MS] / 1000:7.1f}{per_message_ms(cpu.worker - last_cpu.worker, new):>10}"
                  f"{per_message_ms(cpu.database - last_cpu.database, new):>7}"
                  f"{activity.since(last_activity, new)}", flush=True)
            last_sent, last_done, last_cpu, last_activity = sent, done, cpu, activity
            run.peak_backlog = max(run.peak_backlog, queued)
            if not run.gave_up and over_limits(soak, queued):
                # The shared machine's memory before the figures: a backlog that only grows would hold
                # gigabytes of messages in redis-server.
                run.gave_up = True
                soak.stop.set()
                print(f"fleet_soak: backlog {queued} messages, redis-server "
                      f"{soak.broker.info('memory')['used_memory'] / 2**20:.0f} MiB: over --max-backlog or "
                      "--max-broker-mib; the senders stopped, draining", flush=True)
            rounds_over = all(not s.is_alive() for s in soak.senders) or time.time() > last_round_at + 60
            if rounds_over and queued == 0:
                run.drained_at = time.time()
                break
            if time.time() > last_round_at + args.drain_seconds:
                break
    except KeyboardInterrupt:
        run.interrupted = True
        print("fleet_soak: interrupted; reporting what was measured so far", flush=True)
    return run


def queue_every_round(soak: Soak, sent_before: list[int], *, clock: float) -> tuple[list[int], float]:
    """``--backlog``, ``--replay``: the senders' clock started at ``clock`` (seconds since the epoch), and
    waited for until they queued every round; what they sent, and in how many seconds."""
    began = time.monotonic()
    soak.start.value = clock
    while any(sender.is_alive() for sender in soak.senders):
        soak.check_senders()
        time.sleep(0.5)
    soak.check_senders()
    return [a - b for a, b in zip(soak.sent(), sent_before, strict=True)], time.monotonic() - began


def fill_backlog(soak: Soak, central: Central, sent_before: list[int]) -> None:
    """``--backlog``: every round sent while central's worker is stopped (SIGSTOP, its pool with it); the
    caller then lets it go and measures the drain. A fleet's rate fills each batch, as these two cores
    cannot send it live beside central (the senders' CPU is the agents')."""
    processes.signal_groups(central.workers, signal.SIGSTOP)
    sent, seconds = queue_every_round(soak, sent_before, clock=time.time())
    print(f"backlog: {sent[FULL] + sent[UPDATE]} messages ({sent[FULL]} full snapshots, {sent[UPDATE]} "
          f"updates) queued in {seconds:.0f} s while central's worker was stopped; draining now", flush=True)


def fill_staging(soak: Soak, sent_before: list[int]) -> float:
    """``--replay``: every round queued in the senders' own broker databases (central's worker idle,
    nothing reaching it), each message taken at its moment on a clock that starts once they are made
    (``REPLAY_MAKING_MS_PER_MESSAGE``); that clock's start, waited for."""
    messages = soak.rounds * len(soak.hosts)
    clock = time.time() + soak.args.replay_making_ms * messages / 1000
    sent, seconds = queue_every_round(soak, sent_before, clock=clock)
    catch_up_upkeep()
    rephase_usage_settling(soak, clock)
    early = clock - time.time()
    print(f"replay: {sent[FULL] + sent[UPDATE]} messages ({sent[FULL]} full snapshots, {sent[UPDATE]} "
          f"updates) queued aside in {seconds:.0f} s ({1000 * seconds / max(messages, 1):.2f} ms a message)"
          + (f"; their clock starts in {early:.0f} s" if early > 0 else
             f", {-early:.0f} s past their clock's start: each reaches central that late")
          + "; then sent to central at the fleet's pace", flush=True)
    if early > 0:
        time.sleep(early)
    return max(clock, time.time())


def begin_replay(soak: Soak, central: Central, start_beat: Callable[[], Any] | None) -> None:
    """The pacer in the senders' place (what was sent is what it moved; the senders' CPU kept apart) and,
    unless --no-scheduler, central's beat started; the caller starts the clock (``soak.start``)."""
    assert soak.pacer is not None
    soak.agents_cpu_seconds = soak.senders_cpu_seconds()
    process, counters, start = soak.pacer
    soak.senders, soak.counters, soak.start = [process], [counters], start
    if start_beat is not None:
        central.beat = start_beat()


def catch_up_upkeep() -> None:
    """--replay: beat's history and usage upkeep run once in this process before the clock, as a fleet's
    beat would have run them while the rounds were made: the enrolment's samples are rolled up then, not
    in the run (its beat starts with the replay, and its first run would otherwise find them too)."""
    from gpuadmin.fleet.tasks import maintain_history_task
    from gpuadmin.usage.tasks import maintain_usage_task

    began = time.monotonic()
    history, usage = maintain_history_task(), maintain_usage_task()
    print(f"upkeep caught up before the clock in {time.monotonic() - began:.0f} s: history {history}, "
          f"usage {usage}", flush=True)


def rephase_usage_settling(soak: Soak, clock: float) -> None:
    """--replay: each host's usage cursor as last settled at its phase of ``GPUADMIN_USAGE_FLUSH_SECONDS``
    before the clock, as in a fleet whose hosts did not all enrol at once: these enrolled within minutes,
    and the rounds begin later, so that every host would settle in the first round. Their settlings then
    come spread over the run, each host's once a period, as the agents' full-snapshot timers are
    (``rephase_full_timers``)."""
    from django.conf import settings

    from gpuadmin.usage.models import UsageCursor

    period = settings.GPUADMIN_USAGE_FLUSH_SECONDS
    index = {host.name: host.index for host in soak.hosts}
    cursors = [UsageCursor(pk=pk, settled_at=datetime.fromtimestamp(
                   clock - phase(period, index[name], len(soak.hosts)), UTC))
               for pk, name in UsageCursor.objects.filter(host__name__in=list(index)).values_list(
                   "pk", "host__name")]
    UsageCursor.objects.bulk_update(cursors, ["settled_at"], batch_size=1000)
    print(f"usage: {len(cursors)} hosts' settlings spread over {period} s", flush=True)


def how_it_ended(drained_at: float | None, *, backlog: bool, elapsed: float, last_round_at: float) -> str:
    if drained_at is None:
        return "the queue did not drain"
    if backlog:
        return f"the backlog drained in {elapsed:.0f} s"
    if drained_at >= last_round_at:
        return f"the queue drained {drained_at - last_round_at:.0f} s after the last round's end"
    return "the queue drained after the senders were stopped"


def report_long_tasks(soak: Soak) -> None:
    """Beat's upkeep that ran in the workers (``Soak.long_tasks``): its CPU is in the windows it fell in."""
    tasks = soak.long_tasks()
    for name, seconds, returned in tasks:
        print(f"beat's upkeep in a worker: {name.removeprefix('gpuadmin.')} ran {seconds:.1f} s: "
              f"{returned[:200]}")


def measure(soak: Soak, central: Central, *, start_beat: Callable[[], Any] | None = None) -> int:
    """The rounds, a line every ``--sample-seconds``, then the figures over the whole run."""
    from django.db.models import Count, Q
    from django.utils import timezone

    from gpuadmin.fleet.models import Host, SnapshotRejection

    args = soak.args
    history_before = history_bytes()
    # Before the clock each host sent one message, its first full snapshot, which wrote its latest row.
    sent_before, stored_before = soak.sent(), len(soak.hosts)
    rejections_before = soak.refused()
    clock = 0.0
    if args.backlog:
        fill_backlog(soak, central, sent_before)
    elif args.replay:
        clock = fill_staging(soak, sent_before)
        begin_replay(soak, central, start_beat)
        sent_before = soak.sent()
    cpu_before, clock_began = central.sample(), timezone.now()
    clock = clock or time.time()
    if args.backlog:
        processes.signal_groups(central.workers, signal.SIGCONT)
    else:
        soak.start.value = clock
    print(f"{'t s':>6}{'sent full/s':>12}{'update/s':>10}{'ingested/s':>11}{'backlog':>9}{'lag s':>7}"
          f"{'worker ms':>10}{'DB ms':>7}{'reads':>8}{'hit %':>7}{'ckpt':>5}{'avac':>5}  (CPU per message "
          "ingested in the window; PostgreSQL's blocks read from the kernel per message, the share found "
          "in shared buffers, checkpoints and autovacuum runs)", flush=True)
    # The windows count from the statistics as they stand (the enrolment's may not all be in yet).
    run = sample_rounds(soak, central, clock, sent_before=sent_before,
                        done_before=soak.stored() + rejections_before, cpu_before=cpu_before)
    drained_at, interrupted, gave_up = run.drained_at, run.interrupted, run.gave_up
    last_round_at = clock + soak.rounds * args.interval_seconds
    cpu_after, left_queued = central.sample(), soak.queued()
    central.stop()  # measured: its backends now report their last statistics as they exit
    soak.stop.set()
    for sender in soak.senders:
        sender.join(timeout=30)
    sent = [a - b for a, b in zip(soak.sent(), sent_before, strict=True)]
    sent_total = sent[FULL] + sent[UPDATE]
    stored = soak.settled_stored() - stored_before
    elapsed = (drained_at or time.time()) - clock
    # The rounds' span: all of them, or as far as an interruption let them go (--backlog: the fleet's
    # time they cover, all sent before the clock).
    run_seconds = soak.rounds * args.interval_seconds if args.backlog else min(
        soak.rounds * args.interval_seconds, elapsed)
    refusals = SnapshotRejection.objects.order_by().filter(received_at__gte=clock_began)
    refused = dict(refusals.values_list("message_kind").annotate(n=Count("id"))
                   .values_list("message_kind", "n"))
    # Why, by the reason's words before its particulars (digests, numbers).
    reasons = Counter(re.split(r"[0-9]", error, maxsplit=1)[0][:60] for error in refusals.values_list(
        "error", flat=True))
    refused_count = soak.refused() - rejections_before
    # --backlog drains the two queues at their own pace (BACKLOG_REFUSALS). Expected there, nowhere else.
    backlog_refusals = functools.reduce(operator.or_, (Q(error__contains=w) for w in BACKLOG_REFUSALS))
    expected = refusals.filter(backlog_refusals).count() if args.backlog else 0
    messages = stored + refused_count  # what the worker did work for
    asked = Host.objects.filter(full_snapshot_requested_at__gte=clock_began).count()
    current = soak.hosts_current()
    errors = soak.worker_errors()
    ending = how_it_ended(drained_at, backlog=args.backlog, elapsed=elapsed, last_round_at=last_round_at)
    print(f"\nrun: {soak.rounds} rounds of {args.interval_seconds:g} s planned, {run_seconds:.0f} s of them "
          f"sent; {ending}; the backlog's peak {run.peak_backlog} (at a sample); load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"sent: {sent_total} ({sent_total / run_seconds:.1f}/s over the rounds): {sent[FULL]} full "
          f"snapshots ({sent[FULL] / run_seconds:.1f}/s), {sent[UPDATE]} updates "
          f"({sent[UPDATE] / run_seconds:.1f}/s); "
          f"the senders' largest lag behind a host's slot {sent[LAG_MS] / 1000:.1f} s")
    print(f"ingested: {stored} stored ({stored / elapsed:.1f}/s from the first round to the end of the "
          f"drain), {refused_count} refused {refused or ''}, {sent_total - stored - refused_count} neither "
          f"(expired in the queue, or left there: {left_queued}); worker log errors {len(errors)}; "
          f"hosts whose latest stored message is the last their agent sent {current} of {len(soak.hosts)}")
    lag_median, lag_largest = soak.arrival_lags()
    print(f"arrival: each host's latest message reached central {lag_median:.1f} s after its moment "
          f"(median), at most {lag_largest:.1f} s")
    print(f"asks for a full snapshot: hosts asked {asked}; probe requests the senders took {sent[PROBES]}, "
          f"{sent[FULL_ASKS]} of them asking for a full snapshot")
    batches, done_in_batches, waits = soak.update_offers()
    print(f"update batches: {batches}, {done_in_batches} updates done in them "
          f"({done_in_batches / max(batches, 1):.0f} a batch); {waits} offers of updates that then waited "
          "for their base again")
    report_long_tasks(soak)
    worker_cpu = cpu_after.worker - cpu_before.worker
    main_cpu = cpu_after.worker_main - cpu_before.worker_main
    database_cpu = cpu_after.database - cpu_before.database
    both = worker_cpu + database_cpu
    verdict = "met" if messages and 1000 * both / messages < CPU_PER_MESSAGE_REQUIRED_MS else "missed"
    pool = (f" (pool {per_message_ms(worker_cpu - main_cpu, messages)}, main process "
            f"{per_message_ms(main_cpu, messages)})") if args.pool == "prefork" else ""
    print(f"CPU per message ingested (stored or refused; ms): central worker "
          f"{per_message_ms(worker_cpu, messages)}{pool}, "
          f"PostgreSQL {per_message_ms(database_cpu, messages)}, "
          f"together {per_message_ms(both, messages)} "
          f"(issue 36: < {CPU_PER_MESSAGE_REQUIRED_MS} ms: {verdict})")
    senders_cpu = soak.senders_cpu_seconds() if soak.agents_cpu_seconds is None else soak.agents_cpu_seconds
    pacer = "" if soak.agents_cpu_seconds is None else f"; the pacer {soak.senders_cpu_seconds():.1f}"
    print(f"CPU seconds over the run: central worker {worker_cpu:.1f}, PostgreSQL {database_cpu:.1f}, beat "
          f"{cpu_after.beat - cpu_before.beat:.1f}; the senders (the agents' work, not central's) "
          f"{senders_cpu:.1f} in all, {per_message_ms(senders_cpu, sent_total + len(soak.hosts))} ms per "
          f"message sent{pacer}")
    history_after = history_bytes()
    if history_before is not None and history_after is not None:
        host_days = len(soak.hosts) * run_seconds / 86400
        print(f"history per host-day: {(history_after - history_before) / host_days / 1e6:.3f} MB (growth "
              "of the history tables, partitions and indexes included, over hosts x the rounds' span: raw "
              "samples and points before rollups and pruning; a short run's own mix of full snapshots and "
              "changes, and a small one over-counts the pages its tables were just given)")
    for reason, count in reasons.most_common(5):
        print(f"  refused {count}: {reason}...")
    for line in errors[:10]:
        print(f"  worker: {line}")
    if not args.skip_pages and not interrupted:
        time_pages(soak.hosts, args.repeats)
    if drained_at is None and not interrupted:
        print(f"fleet_soak: the queue did not drain within {args.drain_seconds:g} s of the last round")
    lost = sent_total - stored - refused_count
    if gave_up:
        print("fleet_soak: ingest did not keep up (the senders were stopped at the backlog's limit)")
    failed = drained_at is None or refused_count > expected or lost or errors
    return 1 if interrupted or gave_up or failed else 0


def over_limits(soak: Soak, queued: int) -> bool:
    if queued > soak.args.max_backlog:
        return True
    return int(soak.broker.info("memory")["used_memory"]) > soak.args.max_broker_mib * 2**20


def time_pages(hosts: list[Any], repeats: int) -> None:
    import uuid

    from django.contrib.auth import get_user_model
    from django.test import Client

    from benchmarks.fleet import print_pages, time_attention, time_get

    admin = get_user_model().objects.create_superuser(f"soak-{uuid.uuid4().hex[:8]}",
                                                     password=uuid.uuid4().hex)
    client = Client()
    client.force_login(admin)
    rows = [time_get(client, "fleet page", "/", repeats, {})[0],
            time_get(client, "fleet page, attention=1", "/?attention=1", repeats, {})[0],
            time_get(client, "fleet page, sort=free", "/?sort=free", repeats, {})[0],
            *time_attention(repeats),
            time_get(client, "host page", f"/hosts/{hosts[0].name}/", repeats, {})[0]]
    print_pages(f"{len(hosts)} hosts, after the run", rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval-seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2, help="the central worker's pool processes")
    parser.add_argument("--pool", choices=["prefork", "solo"], default="prefork",
                        help="one worker with a prefork pool (as deployed), or --workers solo workers")
    parser.add_argument("--senders", type=int, default=2, help="processes sending as the hosts' agents")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--job-change-percent", type=float, default=1.0,
                        help="hosts starting or ending a job each round")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--max-backlog", type=int, default=50_000,
                        help="stop the senders when this many messages wait (ingest is not keeping up)")
    parser.add_argument("--max-broker-mib", type=int, default=2048,
                        help="stop the senders when redis-server uses this much memory")
    parser.add_argument("--drain-seconds", type=float, default=600.0,
                        help="how long after the last round the queue may take to drain")
    parser.add_argument("--repeats", type=int, default=20, help="timed requests per page (after 2 warm-ups)")
    parser.add_argument("--no-scheduler", action="store_true", help="run no beat (no sweeps, no upkeep)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--backlog", action="store_true",
                     help="send every round while central's worker is stopped, then time the drain (no beat)")
    how.add_argument("--replay", action="store_true",
                     help="queue every round aside first, then send them to central at the fleet's pace")
    parser.add_argument("--replay-making-ms", type=float, default=REPLAY_MAKING_MS_PER_MESSAGE,
                        help="--replay: how long making a message takes, to set the fleet's clock ahead by")
    parser.add_argument("--skip-pages", action="store_true")
    parser.add_argument("--exact-agents", action="store_true",
                        help="senders compute each probe's shape digest, as agents do (more sender CPU)")
    parser.add_argument("--postgres-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the benchmark's PostgreSQL, as a deployment would tune it")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep the workers' and beat's logs there")
    args = parser.parse_args(argv)
    processes.guard()
    print("command: python benchmarks/fleet_soak.py " + " ".join(sys.argv[1:] if argv is None else argv))
    with throwaway_data_dir("gpuadmin-bench-soak-", wait=not args.no_wait), \
            tempfile.TemporaryDirectory(prefix="gpuadmin-fleet-soak-") as work:
        return soak(args, Path(work))


if __name__ == "__main__":
    sys.exit(main())
