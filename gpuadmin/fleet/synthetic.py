"""The one synthetic-host generator: ``make demo``, ``manage.py demo_fleet``, the benchmarks and the tests.

Documents first (no Django, no keys): ``snapshot()``, ``gpu()`` and ``proc()``
build a valid snapshot document (schema 2) piece by piece; ``tests/factories.py``
hands them to the tests, and the demo's few hand-written hosts
(``gpuadmin/demo/fleet.py``) are built from them.

Then whole fleets: each ``DemoHost`` is what an agent would send, with
launchers and their GPU workers (one in ten moving its memory each round),
data loaders holding device files, on some hosts a leaky parent with zombie
children, a pair of orphaned workers still holding memory, a process in D
state, and memory no visible process accounts for. Its figures are ones a real
GPU could report: on each GPU the processes hold no more than is used, and no
more is used than the card has (``memory_contradictions`` says what is wrong
otherwise; ``findings.over_attributed_memory`` flags it on the panel).

Each host signs with its own Ed25519 key and its snapshots go through
``ingest.receive_snapshot``, as a message off the broker would: the first one
offers the key (awaiting acceptance), ``trust.accept_host`` accepts it with
the fingerprint (an audit event, as an approver's acceptance is), and from
then on its snapshots are stored. Host keys are derived from one demo key in
the data directory (``data_dir.DEMO_FLEET_KEY``, made on first use, 0600) and
the host's name, so a later ``demo_fleet --follow`` signs as the hosts an
earlier run enrolled.

``DemoHost.document(round_number)`` is deterministic: the same processes in
every round (same PIDs and start times), their memory and utilization moving a
little from one round to the next, as a busy fleet's do (a GPU's utilization
jitters around its job's level, which moves about once an hour).
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
# A busy GPU holds its job's utilization level within a few points; the level moves about once an hour
# of 10 s rounds (DemoHost._utilization).
UTILIZATION_LEVEL_ROUNDS = 360
UTILIZATION_JITTER_PERCENT = 3
# Processes on a real host that matter to nobody: counted, never listed (scope "matters").
BACKGROUND_PROCESSES = 400
CLOCK_TICKS_PER_SECOND = 100
HOST_UPTIME_SECONDS = 5 * 86400
# What a GPU reports used beyond its processes' memory, and at most what no visible process accounts
# for: the processes get the rest, shared out when they would want more (DemoHost._fit). NVML's v2
# reading (the probe's) leaves driver-reserved memory out of `used`, so on a real GPU that is a few MiB,
# well under GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES: only hosts with the "unattributed" trait show
# memory no process accounts for.
DRIVER_SHARE_BYTES = 4 * MiB
UNATTRIBUTED_MAX_BYTES = 4 * GiB


# --- the documents (no Django, no keys: tests/factories.py re-exports these) ----------------

BOOT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def cmdline_sha256(argv: list[str]) -> str:
    """The probe's digest of a command line: each argument NUL-terminated."""
    return hashlib.sha256(b"".join(a.encode() + b"\0" for a in argv)).hexdigest()


def gpu(index: int = 0, *, uuid: str | None = None, total: int = 80 * GiB, used: int | None = 0,
        utilization_percent: int | None = 0, name: str = "Simulated H100") -> dict[str, Any]:
    """One GPU of a snapshot (``gpus``): ``used`` is the driver's figure, ``total`` the card's."""
    return {
        "index": index,
        "uuid": uuid or f"GPU-sim-{index:04d}",
        "name": name,
        "memory_total_bytes": total,
        "memory_used_bytes": used,
        "utilization_percent": utilization_percent,
    }


def proc(pid: int, *, ppid: int = 1, state: str = "S", start: int | None = None, uid: int = 1000,
         user: str = "alice", name: str = "python", cmdline: list[str] | None = None,
         gpu_memory: dict[str, int | None] | None = None, device_files: list[str] | None = None,
         orphaned: bool = False, reasons: list[str] | None = None, pgid: int | None = None,
         sid: int | None = None, elapsed_seconds: float = 60.0, **extra: Any) -> dict[str, Any]:
    """One process of a snapshot (``processes``); ``extra`` overrides any other field as it is."""
    argv = cmdline if cmdline is not None else [name, f"job{pid}.py"]
    record = {
        "pid": pid,
        "ppid": ppid,
        "state": state,
        "start_time_ticks": start if start is not None else pid * 100,
        "uid": uid,
        "user": user,
        "name": name,
        "cmdline": argv,
        "cmdline_truncated": False,
        "cmdline_sha256": cmdline_sha256(argv),
        "rss_bytes": 100 * MiB,
        "pgid": pgid if pgid is not None else pid,
        "sid": sid if sid is not None else pid,
        "container_id": None,
        "owner": None,
        "elapsed_seconds": elapsed_seconds,
        "kernel_thread": False,
        "orphaned": orphaned,
        "reasons": reasons or [],
        "gpu_memory_bytes": gpu_memory or {},
        "device_files": device_files or [],
    }
    record.update(extra)
    return record


def snapshot(host: str = "gpu01", *, processes: list[dict[str, Any]] | None = None,
             gpus: list[dict[str, Any]] | None = None, taken_at: datetime | None = None,
             boot_id: str = BOOT_ID, pid_max: int = 4194304, pids_in_use: int | None = None,
             backend: str = "simulated", available: bool = True, reason: str | None = None,
             unmatched: list[dict[str, Any]] | None = None, omitted: int = 100,
             kernel: str = "6.18.0-test", driver_version: str | None = None,
             boot_time: str = "2026-12-01T00:00:00Z", agent_pid: int = 4242,
             probe_duration_seconds: float = 0.01) -> dict[str, Any]:
    """A valid snapshot document (schema 2, docs/snapshot.md) of ``host``, taken at ``taken_at`` (now).

    ``omitted``: processes the host runs that matter to nobody, counted and not listed."""
    processes = processes if processes is not None else []
    taken = (taken_at or datetime.now(UTC)).astimezone(UTC)
    return {
        "schema_version": 2,
        "taken_at": taken.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "probe_duration_seconds": probe_duration_seconds,
        "scope": "matters",
        "device_glob": "/dev/nvidia*",
        "host": {
            "name": host,
            "boot_id": boot_id,
            "pid_max": pid_max,
            "pids_in_use": pids_in_use if pids_in_use is not None else len(processes) + omitted,
            "kernel": kernel,
            "driver_version": driver_version,
            "boot_time": boot_time,
            "clock_ticks_per_second": CLOCK_TICKS_PER_SECOND,
            "agent_pid": agent_pid,
        },
        "gpu_backend": {"name": backend, "available": available, "reason": reason},
        "gpus": gpus if gpus is not None else [gpu(0)],
        "processes": processes,
        "process_counts": {
            "total": len(processes) + omitted,
            "zombies": sum(1 for p in processes if p["state"] == "Z"),
            "uninterruptible": sum(1 for p in processes if p["state"] == "D"),
            "omitted": omitted,
        },
        "unmatched_gpu_processes": unmatched or [],
    }


def slurm_owner(job_id: str = "4242", step: str = "0", uid: int | None = 1000) -> dict[str, Any]:
    """The owner block of a Slurm job step's process (docs/snapshot.md, `owner`)."""
    return {"kind": "slurm_job", "job_id": job_id, "step": step, "uid": uid}


def container_owner(container_id: str, name: str | None = "trainer", runtime: str = "docker",
                    image: str | None = "pytorch/pytorch:2.3") -> dict[str, Any]:
    """The owner block of a container's process; pass it with ``container_id=`` to ``proc``."""
    return {"kind": "container", "runtime": runtime, "container_id": container_id,
            "container_name": name, "image": image}


def memory_contradictions(document: dict[str, Any]) -> list[str]:
    """What no real GPU could report: per GPU, processes holding more than is used, or more used than it
    has. Empty for every document this module builds (tests/fleet/test_synthetic.py checks many)."""
    held: dict[str, int] = {}
    for process in document["processes"]:
        for uuid, held_bytes in process["gpu_memory_bytes"].items():
            held[uuid] = held.get(uuid, 0) + (held_bytes or 0)
    wrong = []
    for card in document["gpus"]:
        used, total = card["memory_used_bytes"], card["memory_total_bytes"]
        attributed = held.get(card["uuid"], 0)
        if used is not None and attributed > used:
            wrong.append(f"GPU {card['index']}: processes hold {attributed} bytes, {used} used")
        if used is not None and total is not None and used > total:
            wrong.append(f"GPU {card['index']}: {used} bytes used of {total}")
    return wrong


# --- whole fleets ---------------------------------------------------------------------------


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
        procs: list[dict[str, Any]] = []
        holders: list[tuple[dict[str, Any], int]] = []  # (process, GPU index): who wants memory where
        # Each round is ten seconds after the one before: processes age, their start times stay.
        since_round_zero = 10.0 * round_number

        def add(pid: int, *, ppid: int, user_index: int, name: str, argv: list[str], reasons: list[str],
                state: str = "S", gpu: int | None = None, memory: int = 0, devices: bool = False,
                orphaned: bool = False, pgid: int | None = None, job: int | None = None,
                age: float = 3600.0) -> None:
            uid = 1000 + user_index
            holds = gpu is not None and memory > 0
            device_files = ([f"/dev/nvidia{gpu}", "/dev/nvidiactl", "/dev/nvidia-uvm"]
                            if devices and gpu is not None else [])
            process = proc(
                pid, ppid=ppid, state=state, uid=uid, user=USERS[user_index], name=name, cmdline=argv,
                start=int((HOST_UPTIME_SECONDS - age) * CLOCK_TICKS_PER_SECOND) + pid,
                gpu_memory={uuids[gpu]: memory} if holds and gpu is not None else {},
                device_files=device_files, orphaned=orphaned,
                reasons=reasons,
                pgid=pgid, sid=pgid, elapsed_seconds=age + since_round_zero,
                rss_bytes=2 * GiB if holds else 200 * MiB, owner=_owner_for_job(job, uid),
            )
            procs.append(process)
            if holds and gpu is not None:
                holders.append((process, gpu))

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
                gpu = (launcher * WORKERS_PER_LAUNCHER + rank) % self.gpus if self.gpus else None
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
                    gpu=self.gpus - 1 if self.gpus else None, memory=6 * GiB)
        attributed = self._fit(holders)
        return self._document(procs, attributed, uuids, rng, taken_at, round_number=round_number)

    def _fit(self, holders: list[tuple[dict[str, Any], int]]) -> list[int]:
        """Hold each process to its share of its GPU, so that what they hold fits the card; per GPU, the
        memory its processes now hold.

        A share depends only on how many processes hold that GPU, the same every round: a process under
        its share keeps what it wants (one that moves alone moves), one over it holds its share."""
        room = GPU_MEMORY_BYTES - DRIVER_SHARE_BYTES - UNATTRIBUTED_MAX_BYTES
        counts = [0] * self.gpus
        for _, index in holders:
            counts[index] += 1
        attributed = [0] * self.gpus
        for process, index in holders:
            memory_bytes = process["gpu_memory_bytes"]
            uuid, wanted = next(iter(memory_bytes.items()))
            memory_bytes[uuid] = held = min(wanted, room // counts[index])
            attributed[index] += held
        return attributed

    def _utilization(self, gpu_index: int, round_number: int, rng: random.Random) -> int:
        """A busy GPU's utilization: its job's level, a few points of jitter each round; a new level
        about every UTILIZATION_LEVEL_ROUNDS (each GPU at its own moment), as a real job moves from one
        phase to the next, not a fresh draw every round."""
        offset = int(hashlib.sha256(f"{self.name}:{gpu_index}".encode()).hexdigest()[:8], 16)
        phase = (round_number + offset) // UTILIZATION_LEVEL_ROUNDS
        level = random.Random(f"level:{self.name}:{gpu_index}:{phase}").randrange(45, 97)  # noqa: S311
        return level + rng.randrange(-UTILIZATION_JITTER_PERCENT, UTILIZATION_JITTER_PERCENT + 1)

    def _document(self, procs: list[dict[str, Any]], attributed: list[int], uuids: list[str],
                  rng: random.Random, taken_at: datetime | None, *, round_number: int) -> dict[str, Any]:
        used = [held + DRIVER_SHARE_BYTES for held in attributed]
        if self._traits["unattributed"]:
            for index in range(0, self.gpus, 3):  # memory the driver reports and no visible process holds
                used[index] += min((1 + index % 4) * GiB, UNATTRIBUTED_MAX_BYTES)
        gpus = [gpu(i, uuid=uuids[i], name=GPU_MODEL, total=GPU_MEMORY_BYTES, used=used[i],
                    utilization_percent=0 if not attributed[i] else self._utilization(i, round_number, rng))
                for i in range(self.gpus)]
        return snapshot(
            self.name, processes=procs, gpus=gpus, taken_at=taken_at,
            boot_id=f"{BOOT_ID_PREFIX}{self.index:012x}",
            pids_in_use=len(procs) + BACKGROUND_PROCESSES + 1500,  # threads count too
            omitted=BACKGROUND_PROCESSES, kernel="6.8.0-demo", driver_version="560.35.03", agent_pid=999,
            probe_duration_seconds=0.05,
        )

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
    from gpuadmin.fleet.intake import trust
    from gpuadmin.fleet.intake.ingest import receive_snapshot

    if receive_snapshot(host.message(round_number, taken_at=taken_at)) is not None:
        return True
    if not accept:
        return False
    trust.accept_host(host.name, actor_name="demo_fleet", expected_fingerprint=host.fingerprint,
                      ask_for_snapshot=False)
    return receive_snapshot(host.message(round_number, taken_at=taken_at)) is not None
