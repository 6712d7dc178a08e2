"""Owners in real snapshots: real processes moved into real cgroups shaped as
Docker and Slurm make them, and a job under a real (stand-in) slurmstepd.

Making cgroups needs root and a writable cgroup filesystem. Without them these
tests skip, except under GPUADMIN_REQUIRE_SERVICES=1 (CI), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuadmin.probe.config import RuntimePaths
from tests.probe.helpers import WORKLOADS, Device, Processes, rows_by_pid, snapshot, wait_until
from tests.services import services_required

CID = "5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f"


def unavailable(reason: str) -> None:
    if services_required():
        pytest.fail(f"{reason} (GPUADMIN_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Hierarchy:
    mount_point: str
    version: int


def hierarchies() -> dict[str, Hierarchy]:
    """"v2" (the unified hierarchy) and "freezer" (Slurm's v1 one), where mounted."""
    found: dict[str, Hierarchy] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            tail = fields[fields.index("-") + 1:]
            fstype, super_options = tail[0], tail[2].split(",")
            if fstype == "cgroup2":
                found.setdefault("v2", Hierarchy(fields[4], 2))
            elif fstype == "cgroup" and "freezer" in super_options:
                found.setdefault("freezer", Hierarchy(fields[4], 1))
    return found


@contextlib.contextmanager
def real_cgroup(hierarchy: Hierarchy, relative: str) -> Iterator[str]:
    """mkdir -p a cgroup (a unique top directory first), and remove it all afterwards."""
    if os.geteuid() != 0:
        unavailable("making cgroups needs root")
    path = os.path.join(hierarchy.mount_point, relative)
    try:
        os.makedirs(path)
    except OSError as error:
        unavailable(f"cannot make a cgroup under {hierarchy.mount_point}: {error}")
    try:
        yield path
    finally:
        parts = relative.split("/")
        for depth in range(len(parts), 0, -1):
            directory = os.path.join(hierarchy.mount_point, *parts[:depth])
            # A process just reaped may leave its cgroup busy for a moment.
            wait_until(lambda d=directory: _rmdir(d), f"cgroup {directory} removed")


def _rmdir(directory: str) -> bool:
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def move_into(cgroup: str, pid: int) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(pid))


def unique_name() -> str:
    return f"gpuadmin-test-{os.getpid()}-{secrets.token_hex(3)}"


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill and reap a workload now, so that its cgroup can be removed."""
    process.kill()
    process.wait(timeout=10)


def test_a_process_in_a_docker_shaped_cgroup_is_the_containers(
        processes: Processes, device: Device, tmp_path: Path) -> None:
    v2 = hierarchies().get("v2")
    if v2 is None:
        unavailable("no cgroup v2 hierarchy is mounted")
    assert v2 is not None
    docker_root = tmp_path / "docker"
    config = docker_root / "containers" / CID / "config.v2.json"
    config.parent.mkdir(parents=True)
    # A name with markup: the snapshot carries it verbatim (the pages escape it).
    config.write_text(json.dumps({"ID": CID, "Name": "/trainer<b>",
                                  "Config": {"Image": "pytorch/pytorch:2.3"}}))

    with real_cgroup(v2, f"{unique_name()}/system.slice/docker-{CID}.scope") as cgroup:
        holder = processes.start("holder", device.path)
        try:
            move_into(cgroup, holder.pid)
            document = snapshot(device.glob, runtime_paths=RuntimePaths(docker_root=str(docker_root)))
        finally:
            stop(holder.process)

    row = rows_by_pid(document)[holder.pid]
    assert row["owner"] == {"kind": "container", "runtime": "docker", "container_id": CID,
                            "container_name": "trainer<b>", "image": "pytorch/pytorch:2.3"}
    assert row["container_id"] == CID
    assert rows_by_pid(document)[os.getpid()]["container_id"] is None  # only the process moved in


def test_a_process_in_a_slurm_shaped_cgroup_is_the_jobs(processes: Processes, device: Device) -> None:
    found = hierarchies()
    if "freezer" in found:  # where Slurm's cgroup/v1 plugin puts a job: uid, job, step, task
        hierarchy = found["freezer"]
        relative = f"slurm_{unique_name()}/uid_{os.getuid()}/job_4242/step_0/task_0"
        expected = {"kind": "slurm_job", "job_id": "4242", "step": "0", "uid": os.getuid()}
    elif "v2" in found:  # cgroup/v2: under slurmstepd's scope, no uid in the path
        hierarchy = found["v2"]
        relative = f"{unique_name()}/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"
        expected = {"kind": "slurm_job", "job_id": "4242", "step": "0", "uid": None}
    else:
        unavailable("no cgroup hierarchy is mounted")

    with real_cgroup(hierarchy, relative) as cgroup:
        holder = processes.start("holder", device.path)
        try:
            move_into(cgroup, holder.pid)
            document = snapshot(device.glob)
        finally:
            stop(holder.process)

    row = rows_by_pid(document)[holder.pid]
    assert row["owner"] == expected
    assert row["container_id"] is None


def test_a_task_under_slurmstepd_is_the_jobs_without_slurm_cgroups(
        processes: Processes, device: Device, tmp_path: Path) -> None:
    """proctrack/linuxproc: no cgroup names the job; the task's slurmstepd ancestor does.
    The stand-in is a shell whose comm is slurmstepd and whose title is slurmstepd's."""
    bash = shutil.which("bash")
    assert bash is not None
    stepd = tmp_path / "slurmstepd"
    stepd.symlink_to(bash)
    task = f"{shlex.quote(sys.executable)} {shlex.quote(WORKLOADS)} holder {shlex.quote(device.path)} & wait"
    shell = subprocess.Popen(["slurmstepd: [4242.batch]", "-c", task], executable=str(stepd),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    processes.started.append(shell)
    assert shell.stdout is not None
    task_pid = json.loads(shell.stdout.readline())["pid"]
    processes.track(task_pid)

    rows = rows_by_pid(snapshot(device.glob))

    assert rows[shell.pid]["name"] == "slurmstepd"
    assert rows[task_pid]["owner"] == {"kind": "slurm_job", "job_id": "4242", "step": "batch", "uid": None}
    assert (rows[os.getpid()]["owner"] or {}).get("kind") != "slurm_job"  # the job is below, not above


def test_a_job_shaped_cgroup_inside_a_users_delegated_subtree_is_not_a_job(
        processes: Processes, device: Device) -> None:
    """systemd hands user@<uid>.service's subtree to the user, who can mkdir "job_4242" there:
    the process is that user's unit, not Slurm job 4242 (of whatever uid)."""
    found = hierarchies()
    if "v2" not in found:
        unavailable("no cgroup v2 hierarchy is mounted")
    relative = (f"{unique_name()}/user.slice/user-1000.slice/user@1000.service/app.slice/"
                "slurmstepd.scope/job_4242/step_0/user/task_0")

    with real_cgroup(found["v2"], relative) as cgroup:
        holder = processes.start("holder", device.path)
        try:
            move_into(cgroup, holder.pid)
            document = snapshot(device.glob)
        finally:
            stop(holder.process)

    row = rows_by_pid(document)[holder.pid]
    assert row["owner"] == {"kind": "user_service", "unit": "slurmstepd.scope", "uid": 1000}
