"""From real processes to findings: a real probe snapshot of this machine, ingested as central would.

A parent leaves 5 real zombies; a launcher in its own session forks 3 workers
that hold a temporary "device" file and dies, orphaning them; the simulated GPU
file gives one worker 2 GiB and a PID no process has 3 GiB (unattributed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuadmin.fleet.models import Finding, ProcessLife
from gpuadmin.probe import procfs
from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.snapshot import take_snapshot
from tests.factories import GiB
from tests.keys import deliver
from tests.probe.helpers import Processes, free_pid, state_of, wait_until

pytestmark = pytest.mark.django_db

GPU = "GPU-real-0"


def test_real_zombies_and_orphans_become_findings_about_the_right_processes(
    processes: Processes, tmp_path: Path
) -> None:
    device = tmp_path / "fake-nvidia0"
    device.write_bytes(b"")
    zombie_parent = processes.start("zombie-parent", "5")
    wait_until(lambda: all(state_of(p) == "Z" for p in zombie_parent.children), "5 zombies")
    launcher = processes.start("launcher", str(device), "3", new_session=True)
    workers = sorted(launcher.children)
    launcher.process.kill()
    launcher.process.wait(timeout=10)
    wait_until(lambda: all(procfs.read_stat(p).ppid != launcher.pid for p in workers), "workers re-parented")

    stranger = free_pid()
    simulated = tmp_path / "gpus.json"
    simulated.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "uuid": GPU,
                        "name": "Simulated",
                        "memory_total_bytes": 80 * GiB,
                        "extra_used_bytes": 0,
                        "utilization_percent": 40,
                    }
                ],
                "processes": [
                    {"pid": workers[0], "gpu_uuid": GPU, "used_memory_bytes": 2 * GiB},
                    {"pid": stranger, "gpu_uuid": GPU, "used_memory_bytes": 3 * GiB},
                ],
            }
        )
    )
    config = ProbeConfig(
        gpu_backend="simulated",
        simulated_gpus_path=str(simulated),
        device_glob=str(tmp_path / "fake-nvidia*"),
        host_name="real-host",
    )

    host = deliver(json.dumps(take_snapshot(config)))

    parent_start = procfs.read_stat(zombie_parent.pid).start_time_ticks
    zombies = host.findings.get(kind=Finding.Kind.ZOMBIES, key=f"{zombie_parent.pid}:{parent_start}")
    assert zombies.title.startswith("5 zombies under ")
    assert f"(pid {zombie_parent.pid}," in zombies.title
    assert f"(pid {zombie_parent.pid})" in zombies.remedy
    assert sorted(zombies.details["zombie_pids"]) == sorted(zombie_parent.children)

    orphans = host.findings.get(kind=Finding.Kind.ORPHAN_GPU)
    assert orphans.key == f"pgid:{launcher.pid}"
    assert orphans.title.startswith(f"3 orphans of launcher {launcher.pid} ")
    assert orphans.title.endswith("hold 2 GiB of GPU memory")
    assert orphans.details["pids"] == workers

    unattributed = host.findings.get(kind=Finding.Kind.UNATTRIBUTED_MEMORY)
    assert unattributed.title.endswith(
        "3 GiB used by no visible process (5 GiB used against 2 GiB by visible processes)")
    assert f"pid {stranger}" in unattributed.remedy

    gpu = host.gpus.get()
    assert (gpu.memory_used_bytes, gpu.memory_attributed_bytes) == (5 * GiB, 2 * GiB)

    ours = {*zombie_parent.children, *workers, zombie_parent.pid}
    lives = {life.pid: life for life in ProcessLife.objects.filter(host=host, pid__in=ours)}
    assert set(lives) == {*zombie_parent.children, *workers}  # the parent matters only as family
    assert all(lives[p].was_zombie for p in zombie_parent.children)
    assert all(lives[p].was_orphaned and lives[p].held_device for p in workers)
    assert lives[workers[0]].peak_gpu_memory_bytes == 2 * GiB
