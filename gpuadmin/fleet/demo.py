"""A synthetic fleet through the real ingest path: ``manage.py demo_fleet`` and ``benchmarks/fleet.py``.

Each demo host is what an agent would send: a snapshot document (schema 2)
with launchers and their GPU workers (one in ten moving its memory each
round), data loaders holding device files, on some hosts a leaky parent
with zombie children, a pair of orphaned workers still holding memory, a
process in D state, and memory no visible process accounts for. Each is
signed with the host's own Ed25519 key and goes through
``ingest.receive_snapshot``, as a message off the broker would: the first one
offers the key (awaiting acceptance), ``trust.accept_host`` accepts it with
the fingerprint (an audit event, as an approver's acceptance is), and from
then on its snapshots are stored.

Host keys are derived from one demo key in the data directory
(``data_dir.DEMO_FLEET_KEY``, made on first use, 0600) and the host's name, so
a later ``demo_fleet --follow`` signs as the hosts an earlier run enrolled.

``DemoHost.document(round_number)`` is deterministic: the same processes in
every round (same PIDs and start times), their memory and utilization moving a
little from one round to the next, as a busy fleet's do.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from gpuadmin.data_dir import DEMO_FLEET_KEY
from gpuadmin.wire.signing import (
    MessageKind,
    create_private_key_file,
    fingerprint,
    load_private_key,
    seal,
)

GiB = 1024**3
MiB = 1024**2
GPU_MEMORY_BYTES = 80 * GiB
GPU_MODEL = "NVIDIA H100 80GB HBM3 (demo)"
BOOT_ID_PREFIX = "de300000-0000-4000-8000-"
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
WORKERS_PER_LAUNCHER = 8
MEMORY_MOVES_FRACTION = 0.1
# Processes on a real host that matter to nobody: counted, never listed (scope "matters").
BACKGROUND_PROCESSES = 400
CLOCK_TICKS_PER_SECOND = 100
HOST_UPTIME_SECONDS = 5 * 86400


def host_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:04d}"


def demo_master_key(data_dir: Path) -> bytes:
    """The demo's master secret (the raw bytes of an Ed25519 key file in the data directory)."""
    path = data_dir / DEMO_FLEET_KEY
    create_private_key_file(path)  # no-op when it exists
    raw = load_private_key(path).private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return raw


def host_key(master: bytes, name: str) -> Ed25519PrivateKey:
    """The key of demo host ``name``: the same for every run on this data directory."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(master + b"\0" + name.encode()).digest())


def _cmdline_sha256(argv: list[str]) -> str:
    return hashlib.sha256(b"".join(a.encode() + b"\0" for a in argv)).hexdigest()


def _owner_for_job(job_id: int | None, uid: int) -> dict[str, Any] | None:
    if job_id is None:
        return None
    return {"kind": "slurm_job", "job_id": str(job_id), "step": "0", "uid": uid}


@dataclass
class DemoHost:
    """One synthetic host: ``gpus`` GPUs and about ``processes`` processes that matter."""

    index: int
    name: str
    gpus: int
    processes: int
    key: Ed25519PrivateKey

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint(self.key)

    @cached_property
    def _traits(self) -> dict[str, bool]:
        rng = random.Random(f"traits:{self.name}")  # noqa: S311 - demo figures, not secrets
        return {
            "zombies": rng.random() < 0.3,
            "orphans": rng.random() < 0.2,
            "d_state": rng.random() < 0.05,
            "unattributed": rng.random() < 0.25,
            "slurm": rng.random() < 0.5,
        }

    def gpu_uuid(self, gpu_index: int) -> str:
        return f"GPU-de300000-{self.index:04x}-4{gpu_index:03x}-8000-000000000000"

    def document(self, round_number: int = 0, *, taken_at: datetime | None = None) -> dict[str, Any]:
        """The snapshot of ``round_number``: the same processes each round, their figures moving."""
        rng = random.Random(f"round:{self.name}:{round_number}")  # noqa: S311 - demo figures
        traits = self._traits
        uuids = [self.gpu_uuid(i) for i in range(self.gpus)]
        used = [0] * self.gpus
        procs: list[dict[str, Any]] = []
        # Each round is ten seconds after the one before: processes age, their start times stay.
        since_round_zero = 10.0 * round_number

        def add(pid: int, *, ppid: int, user_index: int, name: str, argv: list[str], reasons: list[str],
                state: str = "S", gpu: int | None = None, memory: int = 0, devices: bool = False,
                orphaned: bool = False, pgid: int | None = None, job: int | None = None,
                age: float = 3600.0) -> None:
            uid = 1000 + user_index
            gpu_memory = {uuids[gpu]: memory} if gpu is not None and memory else {}
            if gpu is not None:
                used[gpu] += memory
            device_files = ([f"/dev/nvidia{gpu}", "/dev/nvidiactl", "/dev/nvidia-uvm"]
                            if devices and gpu is not None else [])
            procs.append({
                "pid": pid, "ppid": ppid, "state": state,
                "start_time_ticks": int((HOST_UPTIME_SECONDS - age) * CLOCK_TICKS_PER_SECOND) + pid,
                "uid": uid, "user": USERS[user_index], "name": name, "cmdline": argv,
                "cmdline_truncated": False, "cmdline_sha256": _cmdline_sha256(argv),
                "rss_bytes": 2 * GiB if gpu_memory else 200 * MiB,
                "pgid": pgid if pgid is not None else pid, "sid": pgid if pgid is not None else pid,
                "container_id": None, "owner": _owner_for_job(job, uid),
                "elapsed_seconds": age + since_round_zero, "kernel_thread": False, "orphaned": orphaned,
                "reasons": reasons, "gpu_memory_bytes": gpu_memory, "device_files": device_files,
            })

        budget = self.processes
        extras: list[str] = []
        if traits["zombies"]:
            extras.append("zombies")
        if traits["orphans"]:
            extras.append("orphans")
        reserved = 7 * ("zombies" in extras) + 2 * ("orphans" in extras)
        launcher = 0
        while len(procs) < budget - reserved:
            parent = 10_000 + launcher * 100
            user_index = (self.index + launcher) % len(USERS)
            job = 400_000 + self.index * 100 + launcher if traits["slurm"] else None
            add(parent, ppid=1, user_index=user_index, name="torchrun", reasons=["ancestor"],
                argv=["torchrun", f"--nproc-per-node={WORKERS_PER_LAUNCHER}", "train.py",
                      f"--run={launcher}"],
                job=job, age=4200.0)
            for rank in range(WORKERS_PER_LAUNCHER):
                if len(procs) >= budget - reserved:
                    break
                pid = parent + 1 + rank
                gpu = (launcher * WORKERS_PER_LAUNCHER + rank) % self.gpus
                if rank % 4 == 3:  # a data loader: holds the device files, no memory
                    add(pid, ppid=parent, user_index=user_index, name="pt_data_worker", reasons=["device"],
                        argv=["python", "-m", "torch.utils.data", f"--worker={rank}"], gpu=gpu, devices=True,
                        job=job)
                    continue
                # A training process's memory mostly stays where its allocator put it; about one in
                # ten grows or shrinks a little from one round to the next.
                memory = (2 + (pid % 7)) * GiB + (pid % 13) * 64 * MiB
                if rng.random() < MEMORY_MOVES_FRACTION:
                    memory += rng.randrange(1, 512) * MiB
                state = "D" if traits["d_state"] and launcher == 0 and rank == 0 else "S"
                add(pid, ppid=parent, user_index=user_index, name="python", state=state,
                    reasons=["gpu"], argv=["python", "-u", "train.py", f"--local-rank={rank}"],
                    gpu=gpu, memory=memory, devices=True, job=job)
            launcher += 1
        if "zombies" in extras:
            add(30_000, ppid=1, user_index=3, name="leaky-parent", reasons=["ancestor"],
                argv=["leaky-parent", "--forks", "6"])
            for pid in range(30_001, 30_007):
                add(pid, ppid=30_000, user_index=3, name="child", argv=[], reasons=["zombie"], state="Z")
        if "orphans" in extras:
            for rank in range(2):
                add(31_001 + rank, ppid=1, user_index=4, name="python", orphaned=True, pgid=31_000,
                    reasons=["gpu"], argv=["python", "worker.py", f"--rank={rank}"],
                    gpu=self.gpus - 1, memory=6 * GiB)
        return self._document(procs, used, uuids, rng, taken_at)

    def _document(self, procs: list[dict[str, Any]], used: list[int], uuids: list[str], rng: random.Random,
                  taken_at: datetime | None) -> dict[str, Any]:
        attributed = list(used)
        if self._traits["unattributed"]:
            for gpu in range(0, self.gpus, 3):  # memory the driver reports and no visible process holds
                used[gpu] += (1 + gpu % 4) * GiB
        gpus = [{
            "index": i, "uuid": uuids[i], "name": GPU_MODEL,
            "memory_total_bytes": GPU_MEMORY_BYTES,
            "memory_used_bytes": min(GPU_MEMORY_BYTES, used[i] + 600 * MiB),  # the driver's own share
            "utilization_percent": 0 if not attributed[i] else rng.randrange(40, 101),
        } for i in range(self.gpus)]
        total = len(procs) + BACKGROUND_PROCESSES
        taken = (taken_at or datetime.now(UTC)).astimezone(UTC)
        return {
            "schema_version": 2,
            "taken_at": taken.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "probe_duration_seconds": 0.05,
            "scope": "matters",
            "device_glob": "/dev/nvidia*",
            "host": {
                "name": self.name,
                "boot_id": f"{BOOT_ID_PREFIX}{self.index:012x}",
                "pid_max": 4194304,
                "pids_in_use": total + 1500,  # threads count too
                "kernel": "6.8.0-demo",
                "driver_version": "560.35.03",
                "boot_time": "2026-12-01T00:00:00Z",
                "clock_ticks_per_second": CLOCK_TICKS_PER_SECOND,
                "agent_pid": 999,
            },
            "gpu_backend": {"name": "simulated", "available": True, "reason": None},
            "gpus": gpus,
            "processes": procs,
            "process_counts": {
                "total": total,
                "zombies": sum(1 for p in procs if p["state"] == "Z"),
                "uninterruptible": sum(1 for p in procs if p["state"] == "D"),
                "omitted": BACKGROUND_PROCESSES,
            },
            "unmatched_gpu_processes": [],
        }

    def message(self, round_number: int = 0, *, taken_at: datetime | None = None) -> dict[str, Any]:
        """The signed message its agent would send for ``round_number``."""
        return seal(self.document(round_number, taken_at=taken_at), MessageKind.SNAPSHOT, self.key)


def demo_hosts(data_dir: Path, count: int, *, gpus: int = 8, processes: int = 200,
               prefix: str = "demo") -> list[DemoHost]:
    master = demo_master_key(data_dir)
    return [
        DemoHost(index=i, name=host_name(prefix, i), gpus=gpus, processes=processes,
                 key=host_key(master, host_name(prefix, i)))
        for i in range(count)
    ]


# --- through central's real path (needs Django) ----------------------------------------------


def send(host: DemoHost, round_number: int, *, accept: bool = True, taken_at: datetime | None = None) -> bool:
    """Deliver the host's snapshot of ``round_number`` as a central worker receives it; True if stored.

    A host central does not know yet offers its key with its first snapshot; with
    ``accept`` it is then accepted by fingerprint (as an approver would, audited)
    and the snapshot is sent again, now stored. ``taken_at``: as ``DemoHost.message``.
    """
    from gpuadmin.fleet import trust
    from gpuadmin.fleet.ingest import receive_snapshot

    if receive_snapshot(host.message(round_number, taken_at=taken_at)) is not None:
        return True
    if not accept:
        return False
    trust.accept_host(host.name, actor_name="demo_fleet", expected_fingerprint=host.fingerprint,
                      ask_for_snapshot=False)
    return receive_snapshot(host.message(round_number, taken_at=taken_at)) is not None
