"""Helpers the fleet tests share (and the web and API tests): a fixed clock, and hosts
as the pages and the API see them, stored through the real ingest path."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from gpuadmin.fleet.intake.validation import SnapshotRejected, parse_snapshot
from gpuadmin.fleet.models import Host
from tests.factories import GiB, gpu, proc, snapshot, snapshot_json
from tests.keys import deliver

# A fixed moment, so that every test reads the same taken_at / received_at.
T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- parse_snapshot (test_validation.py, test_validation_edges.py) ---------------------

# Central's clock when it parses: a second after the snapshots' taken_at (T0).
NOW = at(1)


def rejection(payload: str | bytes | Any) -> SnapshotRejected:
    """What parse_snapshot refuses ``payload`` with (it must refuse it)."""
    with pytest.raises(SnapshotRejected) as caught:
        parse_snapshot(payload, now=NOW)
    return caught.value


def good(**kwargs: Any) -> dict[str, Any]:
    """A factory snapshot of gpu07 taken at T0, which parse_snapshot accepts unless kwargs spoil it."""
    kwargs.setdefault("taken_at", T0)
    kwargs.setdefault("host", "gpu07")
    return snapshot(**kwargs)


HOSTILE_CMDLINE = [
    "python",
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "\x1b[31mred",
    "evil\u202egpj.exe",
]
HOSTILE_USER = "<b>mallory</b>\u202e"
HOSTILE_NAME = "\x1b[2Jx<i>"


def store(host: str = "gpu01", **kwargs: Any) -> Host:
    """Ingest a factory snapshot for ``host``; return the stored Host."""
    return deliver(snapshot_json(host, **kwargs))


def make_offline(host: Host) -> Host:
    """Pretend the host's last snapshot arrived long ago."""
    Host.objects.filter(pk=host.pk).update(last_seen_at=timezone.now() - timedelta(hours=2))
    host.refresh_from_db()
    return host


def busy_host_processes() -> list[dict[str, Any]]:
    """Holders on two GPUs, a device-only holder, two orphans, and zombie trees.

    GPU 0: 20 GiB (pid 101) + 2 x 4 GiB orphans (201, 202) = 28 GiB attributed.
    GPU 1: 8 GiB (pid 102).
    Parent 300 has 5 zombies (301-305); zombie 310's parent (999) is not in the snapshot.
    """
    g0, g1 = "GPU-sim-0000", "GPU-sim-0001"
    return [
        proc(100, user="alice", name="launch", cmdline=["python", "launch.py"], elapsed_seconds=20000),
        proc(101, ppid=100, user="alice", name="python", cmdline=["python", "train.py", "--lr", "3e-4"],
             gpu_memory={g0: 20 * GiB}, elapsed_seconds=3 * 3600 + 12 * 60, reasons=["gpu"]),
        proc(102, ppid=100, user="bob", name="python", cmdline=["python", "eval.py"],
             gpu_memory={g1: 8 * GiB}, elapsed_seconds=50, reasons=["gpu"]),
        proc(103, user="carol", name="nvidia-smi", cmdline=["nvidia-smi", "-l"],
             device_files=["/dev/nvidia0", "/dev/nvidiactl"], elapsed_seconds=600, reasons=["device"]),
        proc(201, ppid=1, user="erin", name="worker", cmdline=["worker", "--rank", "0"], pgid=200, sid=200,
             orphaned=True, gpu_memory={g0: 4 * GiB}, elapsed_seconds=7200, reasons=["gpu"]),
        proc(202, ppid=1, user="erin", name="worker", cmdline=["worker", "--rank", "1"], pgid=200, sid=200,
             orphaned=True, gpu_memory={g0: 4 * GiB}, elapsed_seconds=7200, reasons=["gpu"]),
        proc(300, user="dave", name="leaky-parent", cmdline=["leaky-parent", "--forks", "5"],
             elapsed_seconds=900, reasons=["ancestor"]),
        *[proc(pid, ppid=300, state="Z", user="dave", name="child", cmdline=[], reasons=["zombie"])
          for pid in range(301, 306)],
        proc(310, ppid=999, state="Z", user="frank", name="lost", cmdline=[], reasons=["zombie"]),
    ]


def busy_host_gpus() -> list[dict[str, Any]]:
    # 2 GiB unattributed on each GPU.
    return [gpu(0, used=30 * GiB, utilization_percent=97), gpu(1, used=10 * GiB, utilization_percent=40)]


def store_busy_host(host: str = "gpu01") -> Host:
    return store(host, processes=busy_host_processes(), gpus=busy_host_gpus())


def store_critical_host(host: str) -> Host:
    """A host whose one orphan holds GPU memory: one critical finding, nothing else."""
    return store(host, processes=[proc(10, ppid=1, orphaned=True, pgid=9, sid=9,
                                       gpu_memory={"GPU-sim-0000": GiB})], gpus=[gpu(0, used=GiB)])


def store_hostile_host(host: str = "gpu66") -> Host:
    """A GPU holder whose command line, user and name try to inject markup and spoof the display."""
    return store(host, processes=[
        proc(4242, user=HOSTILE_USER, name=HOSTILE_NAME, cmdline=HOSTILE_CMDLINE,
             gpu_memory={"GPU-sim-0000": 1 * GiB}, reasons=["gpu"]),
        proc(4243, ppid=4242, state="Z", user=HOSTILE_USER, name=HOSTILE_NAME, cmdline=[],
             reasons=["zombie"]),
    ], gpus=[gpu(0, used=1 * GiB)])


@contextmanager
def counted_round_trips() -> Iterator[list[int]]:
    """``[n]`` after the block: how many times the default connection (PostgreSQL) waited for the
    server's answer while the block ran, each turn from sending to receiving in libpq's trace of the
    protocol."""
    from psycopg.pq import Trace

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    counted: list[int] = []
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield counted
        finally:
            pgconn.untrace()
            trace.seek(0)
            senders = [line.split("\t", 1)[0] for line in trace.read().decode(errors="replace").splitlines()]
            counted.append(sum(1 for turn in pairwise(senders) if turn == ("F", "B")))


# --- snapshot updates (test_update_batches.py, tests/integration/test_update_batches.py) --------

def stored_with_updates(host_name: str, state_path: Path, *, taken_at: datetime,
                        count: int = 1) -> list[dict[str, Any]]:
    """``host_name``'s full snapshot taken at ``taken_at`` stored through ingest (its key accepted), and
    the ``count`` signed updates its agent sends next, 10 s apart (gpuadmin/agent/snapshot_choice.py),
    none applied yet."""
    from gpuadmin.agent.snapshot_choice import Limits, choose
    from gpuadmin.fleet.intake.ingest import receive_snapshot
    from gpuadmin.wire.signing import MessageKind
    from tests.keys import accept, host_key

    limits = Limits(full_every_seconds=300, snapshot_max_bytes=8 * 2**20, update_max_bytes=256 * 1024,
                    step_bytes=64 * 2**20)
    accept(host_name)
    choices = [choose(snapshot(host_name, taken_at=taken_at + timedelta(seconds=10 * n)), host_key(host_name),
                      state_path=state_path, now=taken_at.timestamp() + 10 * n, limits=limits)
               for n in range(count + 1)]
    kinds = [c.kind for c in choices]
    assert kinds == [MessageKind.SNAPSHOT] + [MessageKind.SNAPSHOT_UPDATE] * count, kinds
    receive_snapshot(choices[0].message, received_at=taken_at + timedelta(seconds=0.5))
    return [c.message for c in choices[1:]]
