"""What a process in D state waits on (procfs.wait_channel, processes.describe): the kernel function
from /proc/<pid>/wchan and the frames of /proc/<pid>/stack where readable, on real processes.

No test can put a process into D state at will without root tricks on a device; the rows are read
from a real sleeping process whose stat says D, which is all describe() looks at."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpuadmin.probe import procfs
from gpuadmin.probe.processes import describe
from tests.probe.helpers import Processes, wait_until


def test_a_d_state_row_says_what_it_waits_on(processes: Processes) -> None:
    sleeper = processes.start("sleeper")
    wait_until(lambda: procfs.read_stat(sleeper.pid).state == "S", "it to sleep")  # type: ignore[union-attr]
    stat = procfs.read_stat(sleeper.pid)
    assert stat is not None

    stuck = describe(dataclasses.replace(stat, state="D"), uptime_seconds=1e6, cmdline_max_bytes=4096)
    running = describe(stat, uptime_seconds=1e6, cmdline_max_bytes=4096)

    assert "wchan" not in running and "kernel_stack" not in running  # only D rows pay for the reads
    # Some kernels hide wait channels ("0" or empty; CI's does): then the row carries none, rather
    # than the kernel's placeholder. Either way the row says exactly what the kernel gave.
    readable = Path(f"/proc/{sleeper.pid}/wchan").read_text().strip()
    if readable in ("", "0"):
        assert "wchan" not in stuck
    else:
        assert stuck["wchan"] == readable
    try:
        stack = Path(f"/proc/{sleeper.pid}/stack").read_text().strip()
    except OSError:
        stack = ""
    if stack:
        assert stuck["kernel_stack"]
        assert all("+0x" not in frame and "[<" not in frame for frame in stuck["kernel_stack"])
    else:
        assert "kernel_stack" not in stuck

def test_kernel_stack_frames_keep_function_and_module() -> None:
    assert procfs._frame("[<0>] nfs_wait_bit_killable+0x1e/0x90 [nfs]") == "nfs_wait_bit_killable [nfs]"
    assert procfs._frame("[<0>] hrtimer_nanosleep+0xb5/0x130") == "hrtimer_nanosleep"
