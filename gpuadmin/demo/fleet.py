"""The demo's synthetic hosts: a few more rows on the fleet page, through the real signed ingest path.

Each host has its own Ed25519 key (made once, kept in the scenario folder),
enrolled as an approver would (``fleet.intake.trust.accept_host``); the driver seals
each host's document with that key and sends it to ``central`` exactly as an
agent does (``gpuadmin.sending.send_snapshot``), so ingest verifies,
validates and stores it like any other. Their processes are made up (they
live on no machine); the host names say "simulated". The documents are built by
the one synthetic-host generator, ``gpuadmin.fleet.synthetic``; this module
holds only the scenario's few hand-written hosts and their keys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuadmin.demo.claims import GiB, scenario_dir
from gpuadmin.fleet import synthetic
from gpuadmin.probe.owners import owner_from_cgroup
from gpuadmin.wire.signing import (
    MessageKind,
    create_private_key_file,
    load_private_key,
    public_key_text,
    seal,
)

KEYS_FOLDER = "host-keys"
# /proc/<pid>/cgroup as a Slurm job step and a Docker container leave it (the layouts the probe's
# tests build as real cgroups): the owners come from the probe's own reading of them, so the
# host pages show a job and a container exactly as a real agent would report them.
SLURM_JOB_CGROUP = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
CONTAINER_CGROUP = "0::/system.slice/docker-" + "c0ffee" * 10 + "beef.scope\n"
CGROUP_OF_PID = {41001: SLURM_JOB_CGROUP, 41002: SLURM_JOB_CGROUP, 42001: CONTAINER_CGROUP}
BOOT_TIME = "2026-01-05T07:00:00Z"
# Jobs that hold their memory and compute nothing (a notebook kernel, a stalled preprocess): their GPUs
# show 0 %, so the usage page has idle hours beside busy ones.
IDLE_PIDS = frozenset({41010, 42050})


@dataclass(frozen=True)
class SyntheticHost:
    name: str
    gpu_count: int
    gpu_name: str
    memory_total_bytes: int
    # (pid, user, command line, GPU index, GiB held); a pid of the form 4xxxx, made up
    jobs: tuple[tuple[int, str, tuple[str, ...], int, int], ...] = ()
    zombies_of: int | None = None  # a pid among the jobs whose three children are zombies
    sends: bool = True  # False: one snapshot at start, then silence (the host goes offline)


HOSTS = (
    SyntheticHost("sim-a100-01", 8, "Simulated A100 80GB", 80 * GiB, jobs=(
        (41001, "alice", ("python", "train.py", "--config", "llama-7b.yaml"), 0, 61),
        (41002, "alice", ("python", "train.py", "--config", "llama-7b.yaml"), 1, 61),
        (41010, "bob", ("jupyter-kernel", "--ip=127.0.0.1"), 5, 23),
    )),
    SyntheticHost("sim-a100-02", 8, "Simulated A100 80GB", 80 * GiB, jobs=(
        (42001, "carol", ("python", "-m", "vllm.entrypoints.api_server"), 3, 70),
        (42050, "dave", ("python", "preprocess.py"), 6, 4),
    ), zombies_of=42050),
    SyntheticHost("sim-l40s-03", 4, "Simulated L40S", 48 * GiB, jobs=(
        (43001, "erin", ("python", "eval.py", "--checkpoint", "best.pt"), 2, 30),
    )),
    SyntheticHost("sim-rtx-04", 2, "Simulated RTX 6000", 48 * GiB, sends=False),
)


def key_path(host: SyntheticHost) -> Path:
    return scenario_dir() / KEYS_FOLDER / f"{host.name}.pem"


def host_key(host: SyntheticHost) -> Ed25519PrivateKey:
    path = key_path(host)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    create_private_key_file(path)  # only the first time: the host keeps its key across demos
    return load_private_key(path)


def enrol_all() -> None:
    """Accept each synthetic host's key (needs Django); a data dir that knows another key forgets it."""
    from gpuadmin.fleet.intake import trust

    for host in HOSTS:
        public_key = public_key_text(host_key(host))
        try:
            trust.accept_host(host.name, actor_name="make demo", public_key=public_key)
        except trust.KeyMismatch:
            trust.forget_host_key(host.name, actor_name="make demo")
            trust.accept_host(host.name, actor_name="make demo", public_key=public_key)


def _process(pid: int, ppid: int, user: str, argv: tuple[str, ...], *, state: str = "S",
             gpu: tuple[str, int] | None = None) -> dict[str, Any]:
    zombie = state == "Z"
    owner = owner_from_cgroup(CGROUP_OF_PID[pid]) if pid in CGROUP_OF_PID else None
    return synthetic.proc(
        pid, ppid=ppid, state=state, uid=1000 + sum(map(ord, user)), user=user,
        name=(argv[0] if argv else "preprocess.py")[:15], cmdline=list(argv),
        gpu_memory={gpu[0]: gpu[1]} if gpu else {}, reasons=["gpu"] if gpu else ["zombie"] if zombie else [],
        pgid=ppid if zombie else pid, sid=ppid if zombie else pid, elapsed_seconds=3600.0,
        rss_bytes=0 if zombie else 2 * GiB,
        container_id=owner.container_id if owner is not None else None,
        owner=owner.as_document() if owner is not None else None,
    )


def document(host: SyntheticHost, now: datetime | None = None) -> dict[str, Any]:
    """A valid snapshot document (docs/snapshot.md) for this made-up host, taken now: built by the one
    generator (``gpuadmin.fleet.synthetic``), each GPU using exactly what its processes hold."""
    uuids = [f"GPU-{host.name}-{i}" for i in range(host.gpu_count)]
    processes = [_process(pid, 1, user, argv, gpu=(uuids[index], held * GiB))
                 for pid, user, argv, index, held in host.jobs]
    if host.zombies_of is not None:
        processes += [_process(host.zombies_of + n, host.zombies_of, "dave", (), state="Z")
                      for n in (1, 2, 3)]
    used = {uuid: sum(p["gpu_memory_bytes"].get(uuid, 0) for p in processes) for uuid in uuids}
    busy = {uuid for p in processes if p["pid"] not in IDLE_PIDS for uuid in p["gpu_memory_bytes"]}
    gpus = [synthetic.gpu(i, uuid=uuid, name=host.gpu_name, total=host.memory_total_bytes, used=used[uuid],
                          utilization_percent=85 if uuid in busy else 0)
            for i, uuid in enumerate(uuids)]
    return synthetic.snapshot(
        host.name, processes=processes, gpus=gpus, taken_at=now,
        boot_id=hashlib.md5(host.name.encode()).hexdigest(),  # noqa: S324 (an id)
        omitted=400, kernel="6.8.0 (simulated)", driver_version="simulated", boot_time=BOOT_TIME,
        agent_pid=900,
    )


def signed_documents(first: bool) -> list[dict[str, Any]]:
    """Each sending host's snapshot, sealed with its key (``first``: the silent ones too)."""
    return [seal(document(host), MessageKind.SNAPSHOT, host_key(host))
            for host in HOSTS if host.sends or first]
