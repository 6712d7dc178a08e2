"""ProcessRow.from_document and process_rows: a snapshot's process records as the rows the findings
and pages read."""

from __future__ import annotations

import msgspec
import pytest

from gpuadmin.fleet.process_tree import ProcessRow, process_rows
from tests.factories import GiB, proc, slurm_owner


def test_a_full_record_sets_every_field_as_the_constructor_would() -> None:
    record = proc(42, ppid=7, state="D", gpu_memory={"GPU-0": 2 * GiB}, device_files=["/dev/nvidia0"],
                  orphaned=True, reasons=["gpu", "orphan"], owner=slurm_owner("77"), exe="/usr/bin/python3",
                  container_id="c0ffee")
    row = ProcessRow.from_document(record)
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
    with pytest.raises(AttributeError):
        row.pid = 6  # type: ignore[misc]


def test_the_memory_total_is_worked_out_never_taken_from_the_record() -> None:
    record = {**proc(8, gpu_memory={"GPU-0": GiB, "GPU-1": None, "GPU-2": 2 * GiB}),
              "total_gpu_memory_bytes": 1}
    assert ProcessRow.from_document(record).total_gpu_memory_bytes == 3 * GiB
    assert ProcessRow.from_document({**proc(9), "total_gpu_memory_bytes": 5}).total_gpu_memory_bytes == 0


def test_process_rows_keys_each_row_by_pid_and_ignores_fields_it_does_not_read() -> None:
    records = [proc(7), {**proc(9, state="Z"), "cmdline_sha256": "ab" * 32, "future_field": [1]}]
    rows = process_rows({"processes": records})
    assert list(rows) == [7, 9]
    assert rows[9] == ProcessRow.from_document(proc(9, state="Z")) and rows[9].is_zombie
    assert process_rows({}) == {}


def test_a_record_of_the_wrong_shape_is_refused_not_half_read() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\[1\]\.pid"):
        process_rows({"processes": [proc(7), {**proc(8), "pid": "8"}]})
    with pytest.raises(msgspec.ValidationError, match="start_time_ticks"):
        ProcessRow.from_document({"pid": 5, "ppid": 1, "state": "Z"})
