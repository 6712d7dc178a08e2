"""A small lab host, as one snapshot, for the kill request tests.

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

from datetime import datetime
from typing import Any

from tests.factories import BOOT_ID, GiB, gpu, proc, snapshot

GPU0 = "GPU-sim-0000"
GPU1 = "GPU-sim-0001"
HOST = "gpu01"
AGENT_PID = 4242


def processes() -> list[dict[str, Any]]:
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
    procs = [p for p in processes() if p["pid"] not in drop]
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
