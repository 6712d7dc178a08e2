"""Device holders: processes with a file matching the device glob open, as `fuser -v` finds them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.devices import DeviceMatcher
from gpuadmin.probe.snapshot import take_snapshot
from tests.probe.helpers import Device, Processes, assert_valid, rows_by_pid, snapshot


@pytest.mark.parametrize(("path", "held"), [
    ("/dev/nvidia0", True),
    ("/dev/nvidiactl", True),
    ("/dev/nvidia-uvm", True),
    ("/dev/nvidia-caps/nvidia-cap1", True),  # '*' crosses '/', as in fnmatch
    ("/dev/nvidia0 (deleted)", True),  # unlinked while held: still holding it
    ("/dev/null", False),
    ("/dev/nvme0n1", False),
    ("socket:[48213]", False),
    ("/tmp/dev/nvidia0", False),
])
def test_the_default_glob_matches_nvidia_device_files(path: str, held: bool) -> None:
    assert DeviceMatcher("/dev/nvidia*").matches(path) is held


def test_holders_are_found_with_every_file_they_hold_once(
    tmp_path: Path, processes: Processes, device: Device
) -> None:
    second = tmp_path / "fake-nvidiactl"
    second.write_bytes(b"")
    one = processes.start("holder", device.path)
    both = processes.start("holder-of", device.path, str(second), device.path)  # the first one twice
    bystander = processes.start("sleeper")

    rows = rows_by_pid(snapshot(device.glob))

    assert rows[one.pid]["device_files"] == [device.path]
    assert rows[both.pid]["device_files"] == sorted([device.path, str(second)])
    assert rows[both.pid]["reasons"] == ["device"]
    assert bystander.pid not in rows


def test_a_glob_through_a_symlinked_directory_still_matches(
    tmp_path: Path, processes: Processes, device: Device
) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path, target_is_directory=True)
    holder = processes.start("holder", device.path)

    rows = rows_by_pid(snapshot(str(link / "fake-nvidia*")))

    # The kernel names the file by its resolved path.
    assert rows[holder.pid]["device_files"] == [device.path]


def snapshot_as_nobody(glob: str) -> dict[str, Any]:
    """A snapshot taken in a forked child that dropped root for nobody (65534), as a
    non-root agent would run; the parent gets the document back through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            document = take_snapshot(ProbeConfig(gpu_backend="none", device_glob=glob))
            with os.fdopen(write_end, "w") as out:
                json.dump(document, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as returned:
        text = returned.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(text)


def test_files_of_other_users_are_skipped_and_counted_not_fatal(tmp_path: Path) -> None:
    document = snapshot_as_nobody(str(tmp_path / "fake-nvidia*"))

    assert_valid(document)
    me = os.geteuid() if os.geteuid() != 0 else 65534
    others = [p for p in os.listdir("/proc") if p.isdigit() and _owner(p) not in (me, None)]
    if others:  # PID 1 at least is root's, except in a container of one user
        assert document["device_scan_denied_processes"] > 0
    assert document["process_counts"]["total"] > 0


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return None
