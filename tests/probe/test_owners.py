"""Owners from /proc/<pid>/cgroup text: real-world lines of each layout.

Lines marked "as reported" are copied from public bug reports and
`cat /proc/<pid>/cgroup` outputs (the source is named); the others follow the
layout each runtime documents, with made-up ids.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpuadmin.probe.owners import (
    KIND_FIELDS,
    OWNER_KINDS,
    RUNTIMES,
    Owner,
    owner_from_cgroup,
    slurm_job_from_title,
    slurmstepd_ancestor,
)
from gpuadmin.probe.procfs import StatFields

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "gpuadmin/wire/snapshot.schema.json").read_text())
CID = "4f1c0ab2e3d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6f7e8d9c0b1"
CID2 = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
POD = "0c9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a"
POD_SYSTEMD = POD.replace("-", "_")


def v1(path: str, *, systemd: str | None = None) -> str:
    """A cgroup v1 host's file: every controller at `path`, name=systemd at `systemd` (default the same)."""
    controllers = ["pids", "memory", "devices", "freezer", "cpu,cpuacct", "blkio", "cpuset"]
    lines = [f"{12 - i}:{c}:{path}" for i, c in enumerate(controllers)]
    return "\n".join([*lines, f"1:name=systemd:{systemd if systemd is not None else path}"]) + "\n"


def v2(path: str) -> str:
    return f"0::{path}\n"


def container(runtime: str | None, container_id: str = CID) -> Owner:
    return Owner(kind="container", runtime=runtime, container_id=container_id)


def pod(qos: str, *, runtime: str | None, container_id: str | None = CID, pod_uid: str = POD) -> Owner:
    return Owner(kind="kubernetes_pod", runtime=runtime, pod_uid=pod_uid, qos_class=qos,
                 container_id=container_id)


def job(job_id: str, step: str | None, uid: int | None = None) -> Owner:
    return Owner(kind="slurm_job", job_id=job_id, step=step, uid=uid)


CASES: list[tuple[str, str, Owner | None]] = [
    # --- Docker --------------------------------------------------------------------------------
    ("docker, cgroupfs driver, v1 (as reported: kubernetes-mesos#565, inside a slave container)",
     "12:name=systemd:/\n11:hugetlb:/docker/611a8d133d2c636e777745e4dbb1d5866a068fe0f6cc87033e52fe139fca5ba1\n"
     "10:net_prio:/docker/611a8d133d2c636e777745e4dbb1d5866a068fe0f6cc87033e52fe139fca5ba1\n",
     container("docker", "611a8d133d2c636e777745e4dbb1d5866a068fe0f6cc87033e52fe139fca5ba1")),
    ("docker, systemd driver, v1 (as reported: moby#11509)",
     "freezer:/system.slice/docker-cd49b1e38a0c32aeaae5139402dd2a5a1b8bf10c77a04de1f054c8c4829558cb.scope"
     .join(["9:", "\n"]) + "3:devices:/system.slice\n",
     container("docker", "cd49b1e38a0c32aeaae5139402dd2a5a1b8bf10c77a04de1f054c8c4829558cb")),
    ("docker, systemd driver, v2", v2(f"/system.slice/docker-{CID}.scope"), container("docker")),
    ("docker, cgroupfs driver, v2", v2(f"/docker/{CID}"), container("docker")),
    ("docker on a hybrid host: controllers moved, name=systemd still the login (as in moby#34220)",
     v1(f"/docker/{CID}", systemd="/user.slice/user-52321.slice/session-128207.scope"), container("docker")),
    ("systemd inside a docker container (as reported: systemd#11752)",
     v2("/docker/d3d81786f3e154c7c9d379bcc3d4bdb1c55a5ee824195be91b8a40e55fdebe3a/system.slice/opendkim.service"),
     container("docker", "d3d81786f3e154c7c9d379bcc3d4bdb1c55a5ee824195be91b8a40e55fdebe3a")),
    ("docker in docker: the innermost id", v2(f"/docker/{CID2}/docker/{CID}"), container("docker")),
    ("the docker daemon itself (as reported: needrestart#165)",
     "8:memory:/system.slice/docker.service\n1:name=systemd:/system.slice/docker.service\n",
     Owner(kind="system_service", unit="docker.service")),
    # --- Podman --------------------------------------------------------------------------------
    ("podman rootful, systemd driver, v2", v2(f"/machine.slice/libpod-{CID}.scope/container"),
     container("podman")),
    ("podman rootful, cgroupfs driver", v2(f"/libpod_parent/libpod-{CID}"), container("podman")),
    ("podman rootless, in a pod (layout as in podman#6400): the user's delegated subtree, so only a unit",
     v2(f"/user.slice/user-1000.slice/user@1000.service/user.slice/user-libpod_pod_{CID2}.slice/libpod-{CID}.scope/container"),
     Owner(kind="user_service", unit=f"libpod-{CID}.scope", uid=1000)),
    ("podman's conmon is the runtime's, not the container's",
     v2(f"/machine.slice/libpod-conmon-{CID}.scope"),
     Owner(kind="system_service", unit=f"libpod-conmon-{CID}.scope")),
    ("podman unshare (as reported: crun#376)",
     v2("/user.slice/user-1000.slice/user@1000.service/user.slice/podman-6696.scope"),
     Owner(kind="user_service", unit="podman-6696.scope", uid=1000)),
    # --- containerd ----------------------------------------------------------------------------
    ("nerdctl, systemd driver", v2(f"/system.slice/nerdctl-{CID}.scope"), container("containerd")),
    ("containerd, cgroupfs driver, namespace as parent", v2(f"/default/{CID}"), container(None)),
    # --- Kubernetes ----------------------------------------------------------------------------
    ("k8s CRI-O, systemd driver, v1 (as reported: runc#4620)",
     "13:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89"
     ".slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope\n11:files:/\n",
     pod("burstable", runtime="cri-o", pod_uid="a5c1f8d5-1919-434d-add7-4afaafdaef89",
         container_id="5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c")),
    ("k8s docker, systemd driver, v1 (as reported: lxc#3890)",
     "11:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_45a4828bf54d"
     ".slice/docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope\n12:rdma:/\n",
     pod("burstable", runtime="docker", pod_uid="7d4424e6-bb13-42f4-a47a-45a4828bf54d",
         container_id="d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98")),
    ("k8s containerd, drivers disagreeing: slice:prefix:id (as reported: opentelemetry-java#4507)",
     "11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:"
     "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459\n"
     "10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:"
     "cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459\n",
     pod("besteffort", runtime="containerd", pod_uid="0125ec2f-b64a-4868-8f5b-94b56cbab864",
         container_id="ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459")),
    ("k8s containerd, systemd driver, v2 (ids as in netdata#4868's tree)",
     v2("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod55c6c714_b240_4dec_9a45_57b61696ab6e.slice/"
        "cri-containerd-2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36.scope"),
     pod("burstable", runtime="containerd", pod_uid="55c6c714-b240-4dec-9a45-57b61696ab6e",
         container_id="2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36")),
    ("k8s static pod: a 32-hex-digit UID (as in netdata#4868's tree)",
     v2("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8daa50c3a64c9ff60bb9eab7b44b56fd.slice/"
        "cri-containerd-2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5.scope"),
     pod("burstable", runtime="containerd", pod_uid="8daa50c3a64c9ff60bb9eab7b44b56fd",
         container_id="2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5")),
    ("k8s cgroupfs driver, burstable (pod UIDs as in cadvisor#2540)",
     v1(f"/kubepods/burstable/pod1ff47ee6-9685-4726-ac6f-0ff070c452d6/{CID}"),
     pod("burstable", runtime=None, pod_uid="1ff47ee6-9685-4726-ac6f-0ff070c452d6")),
    ("k8s cgroupfs driver, besteffort, v2", v2(f"/kubepods/besteffort/pod{POD}/{CID}"),
     pod("besteffort", runtime=None)),
    ("k8s cgroupfs driver, guaranteed (no QoS level)", v2(f"/kubepods/pod{POD}/{CID}"),
     pod("guaranteed", runtime=None)),
    ("k8s systemd driver, guaranteed",
     v2(f"/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/cri-containerd-{CID}.scope"),
     pod("guaranteed", runtime="containerd")),
    ("kind: the kubelet's own slice prefix",
     v2(f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{POD_SYSTEMD}.slice/cri-containerd-{CID}.scope"),
     pod("besteffort", runtime="containerd")),
    ("k8s: a process in the pod's cgroup, in no container",
     v2(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}.slice"),
     pod("besteffort", runtime=None, container_id=None)),
    ("k8s CRI-O's conmon is not the container",
     v2(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}.slice/crio-conmon-{CID}.scope"),
     pod("besteffort", runtime=None, container_id=None)),
    # --- Slurm ---------------------------------------------------------------------------------
    ("slurm, cgroup v1 task/cgroup", v1("/slurm/uid_1000/job_12345/step_0/task_0"), job("12345", "0", 1000)),
    ("slurm, cgroup v1, batch step", v1("/slurm/uid_2001/job_77/step_batch/task_0"),
     job("77", "batch", 2001)),
    ("slurm, cgroup v1, multiple-slurmd (layout as in cgroup_exporter#5)",
     v1("/slurm_node07/uid_1000/job_12345/step_3/task_1"), job("12345", "3", 1000)),
    ("slurm, v1 only on its own controllers, name=systemd in slurmd's unit",
     "6:freezer:/slurm/uid_1000/job_9/step_0/task_0\n4:memory:/slurm/uid_1000/job_9/step_0/task_0\n"
     "1:name=systemd:/system.slice/slurmd.service\n",
     job("9", "0", 1000)),
    ("slurm, cgroup v2", v2("/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0"), job("3385", "0")),
    ("slurm, cgroup v2, extern step",
     v2("/system.slice/slurmstepd.scope/job_3385/step_extern/user/task_special"),
     job("3385", "extern")),
    ("slurm, cgroup v2, slurmstepd itself", v2("/system.slice/slurmstepd.scope/job_3385/step_batch/slurm"),
     job("3385", "batch")),
    ("slurm, cgroup v2, multiple-slurmd (as in treydock/cgroup_exporter#30)",
     v2("/system.slice/node07_slurmstepd.scope/job_41/step_interactive/user/task_0"),
     job("41", "interactive")),
    ("slurm, cgroup v2, stepd infrastructure: no job", v2("/system.slice/slurmstepd.scope/system"), None),
    ("slurm in a Kubernetes pod (Slinky; path as in stackhpc/slurm-k8s-cluster#38): the job is innermost",
     v2("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poda101c1c8_1589_4313_acf5_02e3ca8d3994.slice/"
        "system.slice/slurmstepd.scope/job_7/step_0/user/task_0"),
     job("7", "0")),
    ("slurm with proctrack/linuxproc: only slurmd's unit (as reported: galaxy#4862)",
     "10:perf_event:/\n9:cpuset:/\n8:memory:/system.slice/slurmd.service\n7:freezer:/\n",
     Owner(kind="system_service", unit="slurmd.service")),
    # --- systemd -------------------------------------------------------------------------------
    ("login session, v2", v2("/user.slice/user-1000.slice/session-3.scope"),
     Owner(kind="login_session", session_id="3", uid=1000, unit="session-3.scope")),
    ("greeter session", v2("/user.slice/user-113.slice/session-c1.scope"),
     Owner(kind="login_session", session_id="c1", uid=113, unit="session-c1.scope")),
    ("login session on v1: name=systemd is believed over lagging controllers (as in moby#34220)",
     "4:memory:/user.slice\n3:cpu,cpuacct:/user.slice\n1:name=systemd:/user.slice/user-52321.slice/session-128207.scope\n",
     Owner(kind="login_session", session_id="128207", uid=52321, unit="session-128207.scope")),
    ("desktop app in the user's manager (as reported: podman#20910)",
     v2("/user.slice/user-10000.slice/user@10000.service/app.slice/app-org.gnome.Terminal.slice/"
        "vte-spawn-f22f14d2-3d44-4304-9879-3fdd0df7b08e.scope"),
     Owner(kind="user_service", unit="vte-spawn-f22f14d2-3d44-4304-9879-3fdd0df7b08e.scope", uid=10000)),
    ("systemd-run --user", v2("/user.slice/user-1000.slice/user@1000.service/app.slice/run-r4f2c.service"),
     Owner(kind="user_service", unit="run-r4f2c.service", uid=1000)),
    ("system service", v2("/system.slice/jupyterhub.service"),
     Owner(kind="system_service", unit="jupyterhub.service")),
    ("PID 1", v2("/init.scope"), Owner(kind="system_service", unit="init.scope")),
    # --- what a user makes inside the subtree systemd delegates to them (user@<uid>.service) ----------
    ("a Slurm-shaped cgroup made by uid 1000 in its own manager is not a job",
     v2("/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_4242/step_0/user/task_0"),
     Owner(kind="user_service", unit="slurmstepd.scope", uid=1000)),
    ("the same on a v1 host's name=systemd line: not a job either",
     "5:freezer:/\n4:memory:/user.slice\n"
     "1:name=systemd:/user.slice/user-1000.slice/user@1000.service/slurm/uid_0/job_4242/step_0\n",
     None),
    ("a docker-shaped scope made by uid 1000: not a container",
     v2(f"/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{CID}.scope"),
     Owner(kind="user_service", unit=f"docker-{CID}.scope", uid=1000)),
    ("a pod-shaped slice made by uid 1000: not a pod",
     v2(f"/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/"
        f"cri-containerd-{CID}.scope"),
     Owner(kind="user_service", unit=f"cri-containerd-{CID}.scope", uid=1000)),
    ("user@0.service made by uid 1000 is still uid 1000's, and no login session",
     v2("/user.slice/user-1000.slice/user@1000.service/user@0.service/session-1.scope"),
     Owner(kind="user_service", unit="session-1.scope", uid=1000)),
    ("a user manager inside a container stays the container's",
     v2(f"/docker/{CID}/user.slice/user-1000.slice/user@1000.service/app.slice/slurm/job_4242"),
     container("docker")),
    # --- nothing to say --------------------------------------------------------------------------
    ("the root cgroup, v2", v2("/"), None),
    ("the root cgroup, v1", v1("/"), None),
    ("a slice alone", v2("/user.slice"), None),
    ("talos system container (as reported: talos#3950)", v2("/system/etcd"), None),
    ("this sandbox's layout", "4:memory:/process_api/4115e2c0dccaa5218d229d1a8acccb75\n0::/\n", None),
    ("65 hex digits are not an id", v2(f"/docker/{CID}0"), None),
    ("empty file", "", None),
    ("no colons", "garbage\n", None),
    ("an empty path", "1:name=systemd:\n", None),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_owner_named_by_a_cgroup_file(text: str, expected: Owner | None) -> None:
    assert owner_from_cgroup(text) == expected


def test_every_owner_document_fits_the_schema() -> None:
    """Each kind's document carries exactly its fields, and the schema lists them all."""
    owner_schema = SCHEMA["$defs"]["owner"]
    assert list(OWNER_KINDS) == owner_schema["properties"]["kind"]["enum"]
    assert [*RUNTIMES, None] == owner_schema["properties"]["runtime"]["enum"]
    listed = set(owner_schema["properties"])
    for kind, names in KIND_FIELDS.items():
        assert {"kind", *names} <= listed, kind
    for _, _, expected in CASES:
        if expected is not None:
            document = expected.as_document()
            assert set(document) == {"kind", *KIND_FIELDS[expected.kind]}


def test_unknown_and_hostile_text_gives_no_owner_and_no_error() -> None:
    rng = random.Random(11)
    alphabet = "0123456789abcdef:/-_.@\n kubepodsslurmjob_step_uid_dockerlibpodscopeslicesession"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120)))
        owner = owner_from_cgroup(text)
        assert owner is None or owner.kind in OWNER_KINDS
    assert owner_from_cgroup("0::/" + "a/" * 50_000) is None
    assert owner_from_cgroup("\x00\x1b[31m:\u202e:/evil\n") is None


@pytest.mark.parametrize(("title", "expected"), [
    ("slurmstepd: [4242.0]", job("4242", "0")),
    ("slurmstepd: [4242.batch]", job("4242", "batch")),
    ("slurmstepd: [4242.extern]", job("4242", "extern")),
    ("slurmstepd: [4242.0+1]", job("4242", "0+1")),
    ("slurmstepd:", None),
    ("/usr/sbin/slurmstepd", None),
    ("python train.py", None),
])
def test_the_job_in_a_slurmstepd_title(title: str, expected: Owner | None) -> None:
    assert slurm_job_from_title(title) == expected


def stat(pid: int, ppid: int, comm: str) -> StatFields:
    return StatFields(pid=pid, comm=comm, state="S", ppid=ppid, pgid=pid, sid=pid, flags=0,
                      num_threads=1, start_time_ticks=pid, rss_pages=1)


def test_the_nearest_slurmstepd_ancestor() -> None:
    stats = {s.pid: s for s in [stat(1, 0, "systemd"), stat(10, 1, "slurmd"), stat(20, 1, "slurmstepd"),
                                 stat(30, 20, "bash"), stat(40, 30, "python"), stat(50, 1, "python")]}
    assert slurmstepd_ancestor(40, stats) == 20
    assert slurmstepd_ancestor(30, stats) == 20
    assert slurmstepd_ancestor(20, stats) is None  # itself is not its own ancestor
    assert slurmstepd_ancestor(50, stats) is None
    assert slurmstepd_ancestor(999, stats) is None
    looped = {1: stat(1, 2, "a"), 2: stat(2, 1, "b")}  # a table read mid-change may loop
    assert slurmstepd_ancestor(1, looped) is None
