"""ProcessRow.from_document: a snapshot's process record as the row the findings and pages read."""

from __future__ import annotations

import dataclasses

import pytest

from gpuadmin.fleet.process_tree import ProcessRow
from tests.factories import GiB, proc, slurm_owner


def test_a_full_record_sets_every_field_as_the_constructor_would() -> None:
    record = proc(42, ppid=7, state="D", gpu_memory={"GPU-0": 2 * GiB}, device_files=["/dev/nvidia0"],
                  orphaned=True, reasons=["gpu", "orphan"], owner=slurm_owner("77"), exe="/usr/bin/python3",
                  container_id="c0ffee")
    row = ProcessRow.from_document(record)
    # Filled in without __init__: a field added to ProcessRow but not to from_document fails here.
    assert set(vars(row)) == {f.name for f in dataclasses.fields(ProcessRow)}
    assert row == ProcessRow(
        pid=42, ppid=7, state="D", start_time_ticks=4200, uid=1000, user="alice", name="python",
        cmdline=("python", "job42.py"), cmdline_truncated=False, rss_bytes=100 * 1024**2, pgid=42, sid=42,
        container_id="c0ffee", elapsed_seconds=60.0, orphaned=True, kernel_thread=False,
        reasons=("gpu", "orphan"), gpu_memory_bytes={"GPU-0": 2 * GiB}, device_files=("/dev/nvidia0",),
        owner=slurm_owner("77"), exe="/usr/bin/python3",
    )
    assert row.is_uninterruptible and row.holds_gpu and row.total_gpu_memory_bytes == 2 * GiB


def test_a_minimal_record_gets_the_defaults_and_the_row_stays_frozen() -> None:
    row = ProcessRow.from_document({"pid": 5, "ppid": 1, "state": "Z", "start_time_ticks": 9})
    assert row == ProcessRow(pid=5, ppid=1, state="Z", start_time_ticks=9, uid=None, user=None, name="",
                             cmdline=(), cmdline_truncated=False, rss_bytes=None)
    assert row.command_line == "[]" and row.is_zombie and not row.holds_gpu
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.pid = 6  # type: ignore[misc]
