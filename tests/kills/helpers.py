"""Helpers the kill tests share: filing shortcuts, the lab host, real trainers, one finished kill.

The lab host, as one snapshot (`lab_snapshot`):

    1      init (root)
    2      kthreadd (kernel thread)
    4240   celery worker (gpuadmin)         <- ancestor of the agent
    4242   celery worker (gpuadmin)         <- the agent (snapshot host.agent_pid)
    4120   python train.py (alice)          <- launcher, 10 GiB on GPU 0
      4121   pt_data_worker (alice)         <- 6 GiB on GPU 0
        4123 pt_data_worker (alice)         <- grandchild, 2 GiB on GPU 0
      4122   pt_data_worker (alice)         <- zombie child
      4124   helper (postgres)              <- descendant owned by a protected user
    4199   supervisor (svc)                 <- parent of three zombies
      4200, 4201, 4202 <defunct>
    4300   python stuck.py (bob)            <- state D, 4 GiB on GPU 1
    4400   postgres (postgres)              <- protected user
    4500   sshd: admin (root, uid 0)
    4600   python eval.py (carol, uid 1002) <- 1 GiB on GPU 1
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.test import TestCase
from django.utils import timezone

from gpuadmin.celery import app
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.probe import procfs
from gpuadmin.wire.task_names import EXECUTE_KILL_ORDER, NOTIFY_KILL_EVENT
from tests.environment import without_coverage
from tests.factories import BOOT_ID, GiB, gpu, proc, snapshot
from tests.keys import deliver, enrol

REASON = "job finished yesterday, memory still held"


def file(user: Any, pid: int, **kwargs: Any) -> KillRequest:
    kwargs.setdefault("reason", REASON)
    start = kwargs.pop("start", pid * 100)
    return services.file_request(user, host=kwargs.pop("host", "gpu01"), pid=pid, start_time_ticks=start,
                                 **kwargs)


def refreshed(kill_request: KillRequest) -> KillRequest:
    kill_request.refresh_from_db()
    return kill_request


def actions(kill_request: KillRequest | None = None) -> list[str]:
    from gpuadmin.audit.models import AuditEvent

    events = AuditEvent.objects.order_by("sequence")
    if kill_request is not None:
        events = events.filter(kill_request_id=kill_request.pk)
    return list(events.values_list("action", flat=True))


def store_snapshot(document: dict[str, Any], *, received_at: datetime | None = None) -> Host:
    """Make ``document`` the host's latest snapshot, as ingest would (without findings or history)."""
    received_at = received_at or timezone.now()
    taken_at = datetime.fromisoformat(document["taken_at"])
    host, _ = Host.objects.get_or_create(name=document["host"]["name"])
    if not host.key_accepted:
        enrol(host)  # orders go only to hosts whose key an approver accepted
    host.last_seen_at = received_at
    host.last_snapshot_taken_at = taken_at
    host.boot_id = document["host"]["boot_id"]
    host.save()
    LatestSnapshot.objects.update_or_create(
        host=host, defaults={"taken_at": taken_at, "received_at": received_at, "document": document}
    )
    return host


# --- the lab host -------------------------------------------------------------------

GPU0 = "GPU-sim-0000"
GPU1 = "GPU-sim-0001"
HOST = "gpu01"
AGENT_PID = 4242


def lab_processes() -> list[dict[str, Any]]:
    return [
        proc(1, ppid=0, user="root", uid=0, name="systemd", cmdline=["/sbin/init"]),
        proc(2, ppid=0, user="root", uid=0, name="kthreadd", cmdline=[], kernel_thread=True),
        proc(4240, ppid=1, user="gpuadmin", uid=990, name="celery",
             cmdline=["celery", "-A", "gpuadmin", "worker", "-Q", "host.gpu01"]),
        proc(AGENT_PID, ppid=4240, user="gpuadmin", uid=990, name="celery",
             cmdline=["celery", "-A", "gpuadmin", "worker", "-Q", "host.gpu01"]),
        proc(4120, user="alice", name="python", cmdline=["python", "train.py", "--epochs", "90"],
             gpu_memory={GPU0: 10 * GiB}, device_files=["/dev/nvidia0"]),
        proc(4121, ppid=4120, user="alice", name="pt_data_worker", gpu_memory={GPU0: 6 * GiB}),
        proc(4123, ppid=4121, user="alice", name="pt_data_worker", gpu_memory={GPU0: 2 * GiB}),
        proc(4122, ppid=4120, user="alice", name="pt_data_worker", state="Z", cmdline=[]),
        proc(4124, ppid=4120, user="postgres", uid=70, name="helper"),
        proc(4199, user="svc", uid=1500, name="supervisor", cmdline=["supervisord", "-n"]),
        proc(4200, ppid=4199, user="svc", uid=1500, name="worker", state="Z", cmdline=[]),
        proc(4201, ppid=4199, user="svc", uid=1500, name="worker", state="Z", cmdline=[]),
        proc(4202, ppid=4199, user="svc", uid=1500, name="worker", state="Z", cmdline=[]),
        proc(4210, ppid=1, user="svc", uid=1500, name="lost", state="Z", cmdline=[]),
        proc(4300, user="bob", uid=1001, name="python", state="D", cmdline=["python", "stuck.py"],
             gpu_memory={GPU1: 4 * GiB}),
        proc(4400, user="postgres", uid=70, name="postgres", cmdline=["postgres", "-D", "/var/lib/pg"]),
        proc(4500, user="root", uid=0, name="sshd", cmdline=["sshd: admin [priv]"]),
        proc(4600, user="carol", uid=1002, name="python", cmdline=["python", "eval.py"],
             gpu_memory={GPU1: 1 * GiB}),
    ]


def lab_snapshot(*, drop: tuple[int, ...] = (), replace: dict[int, dict[str, Any]] | None = None,
                 extra_used: dict[str, int] | None = None, boot_id: str = BOOT_ID,
                 taken_at: datetime | None = None) -> dict[str, Any]:
    """The lab, optionally with processes gone (drop), changed (replace) or unaccounted memory."""
    procs = [p for p in lab_processes() if p["pid"] not in drop]
    for pid, record in (replace or {}).items():
        procs = [record if p["pid"] == pid else p for p in procs]
    extra_used = extra_used or {}
    used = {GPU0: 0, GPU1: 0}
    for p in procs:
        for uuid, size in p["gpu_memory_bytes"].items():
            used[uuid] += size or 0
    doc = snapshot(
        HOST,
        processes=procs,
        gpus=[gpu(i, used=used[uuid] + extra_used.get(uuid, 0)) for i, uuid in enumerate((GPU0, GPU1))],
        boot_id=boot_id,
        taken_at=taken_at,
    )
    doc["host"]["agent_pid"] = AGENT_PID
    return doc


# --- real processes: trainers with real signal handlers, and snapshot records that
# carry their real identity (start time, uid, digest, boot id) -----------------------

# Prints "ready" once its handlers are installed, then sleeps until a signal ends it.
TRAINER = textwrap.dedent(
    """
    import os, signal, sys, time
    checkpoint = sys.argv[1]
    mode = sys.argv[2]

    def save_and_exit(signum, frame):
        with open(checkpoint, "w") as f:
            f.write(f"saved on {signal.Signals(signum).name} at {time.time()!r}")
        sys.exit(0)

    if mode == "checkpoint-on-sigint":
        signal.signal(signal.SIGINT, save_and_exit)
    elif mode == "ignore-sigint":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, save_and_exit)
    elif mode == "ignore-both":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        time.sleep(3600)
    """
)


def start_trainer(directory: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    checkpoint = directory / f"checkpoint-{mode}.txt"
    child = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(checkpoint), mode], stdout=subprocess.PIPE, text=True,
        env=without_coverage(),
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child, checkpoint


def real_record(pid: int, **extra: Any) -> dict[str, Any]:
    """A snapshot process record with the live process's real identity."""
    stat = procfs.read_stat(pid)
    raw = procfs.read_cmdline_bytes(pid)
    assert stat is not None and raw is not None, f"PID {pid} is gone"
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]
    record = proc(
        pid, ppid=stat.ppid, state=stat.state, start=stat.start_time_ticks, uid=os.getuid(),
        user="root" if os.getuid() == 0 else str(os.getuid()), name=stat.comm, cmdline=argv, **extra,
    )
    record["cmdline_sha256"] = procfs.cmdline_sha256(raw)
    return record

# One finished kill, told through the real services, for tests that read its audit trail.
# The lab host's launcher (pid 4120, alice, 10 GiB on GPU 0) is filed by the requester,
# approved by the approver (the order goes to a recorder instead of a broker: the broker
# is not under test here), started, sent SIGINT, exits, finishes, and a later snapshot
# confirms the memory came back: the events a real agent reports
# (tests/kills/test_progress.py), in its order.

STORY_PID = 4120
REASON = "orphaned worker holds 10 GiB on GPU 0"
PLAN = [{"signal": "SIGINT", "grace_seconds": 10}, {"signal": "SIGTERM", "grace_seconds": 20},
        {"signal": "SIGKILL", "grace_seconds": 30}]
EXIT_DETAIL = "exited (after SIGINT, 0.31 s after it was sent)"


@dataclass
class Story:
    kill_request: KillRequest
    orders: list[dict[str, Any]]


def _committed():
    # Runs what waits for the commit (the order's send, the snapshot's receivers) in
    # tests inside a transaction; with no transaction they run at once anyway.
    return TestCase.captureOnCommitCallbacks(execute=True)


def finished_kill(requester: Any, approver: Any) -> Story:
    """File, approve, run and settle one kill; return the request (refreshed) and the orders sent."""
    store_snapshot(lab_snapshot(taken_at=timezone.now() - timedelta(seconds=60)))
    orders: list[dict[str, Any]] = []

    def record_send(name: str, args: Any = None, **options: Any) -> None:
        orders.append(args[0])

    kill_request = services.file_request(requester, host="gpu01", pid=STORY_PID,
                                         start_time_ticks=STORY_PID * 100, reason=REASON, plan=PLAN)
    with mock.patch.object(app, "send_task", record_send), _committed():
        services.approve(kill_request.pk, approver)
    kill_request.refresh_from_db()

    finished_at = datetime.now(UTC) - timedelta(seconds=2)

    def report(seq: int, kind: str, **fields: Any) -> None:
        services.record_progress({
            "request_id": kill_request.order_request_id, "seq": seq, "event": kind,
            "at": (finished_at - timedelta(seconds=(4 - seq) * 0.25)).isoformat(),
            "pid": None, "start_time_ticks": None, "signal": None, "method": None, "detail": "", **fields,
        })

    target = {"pid": STORY_PID, "start_time_ticks": STORY_PID * 100, "method": "pidfd"}
    report(1, "started", detail=f"executing {len(PLAN)} steps on 1 target(s)")
    report(2, "signal_sent", signal="SIGINT", detail="sent SIGINT (step 1 of 3; grace 10 s)", **target)
    report(3, "target_exited", signal="SIGINT", detail=EXIT_DETAIL, **target)
    report(4, "finished", result="succeeded", detail="every target not refused is gone (1 exited)",
           targets=[{"pid": STORY_PID, "start_time_ticks": STORY_PID * 100, "user": "alice", "name": "python",
                     "outcome": "exited", "signals_sent": ["SIGINT"], "method": "pidfd",
                     "detail": EXIT_DETAIL}])
    kill_request.refresh_from_db()

    later = lab_snapshot(drop=(STORY_PID,))
    taken_at = kill_request.finished_at + timedelta(seconds=1)
    later["taken_at"] = taken_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with _committed():
        deliver(json.dumps(later), received_at=taken_at + timedelta(seconds=1))
    kill_request.refresh_from_db()
    return Story(kill_request=kill_request, orders=orders)


# --- fixtures (registered by tests/kills/conftest.py and tests/accounts/conftest.py) -------


def protect_like_the_lab(settings: Any) -> None:
    """The lab's protections (a conftest applies them to every test of its directory)."""
    settings.GPUADMIN_PROTECTED_USERS = ["postgres"]
    settings.GPUADMIN_PROTECTED_UIDS = []
    settings.GPUADMIN_PROTECTED_COMMAND_PATTERNS = [r"^sshd\b"]
    settings.GPUADMIN_ALLOW_SELF_APPROVAL = False


@pytest.fixture
def lab(db: None) -> Host:
    """The lab host, its latest snapshot taken a minute ago."""
    return store_snapshot(lab_snapshot(taken_at=timezone.now() - timedelta(seconds=60)))


class SentTasks(list):
    """Every task central published: (name, args, kwargs)."""

    def orders(self) -> list[dict[str, Any]]:
        return [args[0] for name, args, _ in self if name == EXECUTE_KILL_ORDER]


@pytest.fixture
def sent(monkeypatch) -> SentTasks:
    """Capture what central publishes instead of talking to a broker (the broker is not under test here).

    Notification tasks (``gpuadmin.notify.*``, queued after each change commits) are left out:
    tests/notify covers them, and the workflow's tests count orders.
    """
    from gpuadmin.celery import app

    record = SentTasks()

    def fake_send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        if name != NOTIFY_KILL_EVENT:
            record.append((name, args, options))

    monkeypatch.setattr(app, "send_task", fake_send_task)
    return record


# The launcher and its two workers (18 GiB on GPU 0) of lab_snapshot(): what `killed` kills.
KILLED = (4120, 4121, 4123)


@pytest.fixture
def killed(lab: Any, requester: Any, approver: Any, sent: Any, approve_committed: Any) -> KillRequest:
    """A request for the launcher and its two workers, reported finished by the agent (its steps 5 s ago)."""
    kill_request = file(requester, 4120, include_descendants=True)
    approve_committed(kill_request, approver)
    finished_at = datetime.now(UTC)
    order_id = refreshed(kill_request).order_request_id

    def report(seq: int, kind: str, pid: int | None = None, **fields: Any) -> None:
        services.record_progress({
            "request_id": order_id, "seq": seq, "event": kind, "pid": pid,
            "start_time_ticks": pid * 100 if pid else None,
            "at": (finished_at - timedelta(seconds=5 - seq * 0.1)).isoformat(), **fields,
        })

    report(1, "started")
    for seq, pid in enumerate(KILLED, start=2):
        report(seq, "target_exited", pid, detail="exited")
    report(9, "finished", result="succeeded", detail="all gone")
    return refreshed(kill_request)
