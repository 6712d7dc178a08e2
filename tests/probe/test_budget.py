"""Fitting a snapshot under the size limit (gpuadmin/probe/budget.py), on documents built by hand.

The real-process case (400 device holders with hostile arguments, through
central's validation and ingest) is tests/fleet/intake/test_snapshot_budget.py.
"""

from __future__ import annotations

import json

from gpuadmin.probe.budget import (
    CMDLINE_ROW_MAX_BYTES,
    CMDLINE_TIGHT_MAX_BYTES,
    envelope_size,
    fit_snapshot,
    seal_snapshot,
)
from gpuadmin.wire.signing import canonical_json, generate_private_key
from tests.factories import gpu, proc, snapshot
from tests.probe.helpers import assert_valid

GPU = "GPU-budget-0"
CONTROL = "\x01" * 4000  # 4000 bytes raw, six each once escaped (\u0001)


def holders_under_a_launcher(count: int, argument: str = CONTROL) -> dict:
    launcher = proc(100, reasons=["ancestor"], cmdline=["torchrun", argument])
    workers = [proc(1000 + i, ppid=100, reasons=["device"], cmdline=["python", argument],
                    device_files=["/dev/nvidia0"]) for i in range(count)]
    return snapshot("budget", processes=[launcher, *workers], gpus=[gpu(0, uuid=GPU)])


def test_a_snapshot_that_fits_is_left_as_the_probe_took_it() -> None:
    document = snapshot("budget", processes=[proc(10, reasons=["device"])])
    assert fit_snapshot(document, max_bytes=1024 * 1024) == document


def test_a_command_line_is_cut_to_its_row_budget_counted_as_escaped_json() -> None:
    document = holders_under_a_launcher(1)
    fitted = fit_snapshot(document, max_bytes=1024 * 1024)
    for row in fitted["processes"]:
        assert len(canonical_json(row["cmdline"])) <= CMDLINE_ROW_MAX_BYTES
        assert row["cmdline_truncated"] is True
        assert row["cmdline"][1] == CONTROL[: len(row["cmdline"][1])]  # a prefix, nothing rewritten
        assert len(row["cmdline"][1]) > 1000
    assert fitted["left_out"] == {"processes": 0, "by_reason": {}, "cmdlines_shortened": 2,
                                  "max_bytes": 1024 * 1024}
    assert document["processes"][1]["cmdline"][1] == CONTROL  # the probe's document is not changed
    assert_valid(fitted)


def test_plain_command_lines_of_the_probe_s_full_length_are_not_cut() -> None:
    document = holders_under_a_launcher(3, argument="x" * 4090)
    assert fit_snapshot(document, max_bytes=1024 * 1024) == document


def test_when_rows_do_not_fit_command_lines_shrink_before_any_row_is_left_out() -> None:
    document = holders_under_a_launcher(40)
    # 41 rows at the tight budget fit in 64 KiB; at the row budget they would not.
    fitted = fit_snapshot(document, max_bytes=64 * 1024)
    assert len(fitted["processes"]) == 41
    assert all(len(canonical_json(r["cmdline"])) <= CMDLINE_TIGHT_MAX_BYTES for r in fitted["processes"])
    assert fitted["left_out"]["processes"] == 0 and fitted["left_out"]["cmdlines_shortened"] == 41


def test_gpu_holders_come_first_with_the_ancestors_the_tree_needs() -> None:
    holders = [proc(2000 + i, ppid=300, reasons=["gpu"], gpu_memory={GPU: 1}) for i in range(3)]
    parent_of_holders = proc(300, ppid=200, reasons=["ancestor"])
    grandparent = proc(200, ppid=1, reasons=["ancestor"])
    zombie_parent = proc(400, reasons=["ancestor"], cmdline=["spawner", CONTROL])
    zombie = proc(401, ppid=400, state="Z", reasons=["zombie"], cmdline=[])
    device_holders = [proc(5000 + i, reasons=["device"], cmdline=["python", CONTROL]) for i in range(30)]
    rows = [grandparent, parent_of_holders, zombie_parent, zombie, *holders, *device_holders]
    document = snapshot("budget", processes=sorted(rows, key=lambda r: r["pid"]), gpus=[gpu(0, uuid=GPU)])
    frame = len(canonical_json({**document, "processes": []})) + 300
    room_for_a_few = frame + 8 * 1200  # a handful of rows with their tight command lines

    fitted = fit_snapshot(document, max_bytes=room_for_a_few)

    kept = {row["pid"] for row in fitted["processes"]}
    assert 0 < len(kept & {r["pid"] for r in device_holders}) < 30
    assert {200, 300, 2000, 2001, 2002} <= kept  # every GPU holder, and its tree up to the top
    assert not {400, 401} & kept  # device holders outrank the zombie, and fill what is left
    left_out = fitted["left_out"]
    assert left_out["processes"] == len(rows) - len(kept)
    assert left_out["by_reason"] == {
        "ancestor": 1, "device": 30 - len(kept & {r["pid"] for r in device_holders}), "zombie": 1,
    }
    assert [r["pid"] for r in fitted["processes"]] == sorted(kept)  # still in PID order
    assert len(canonical_json(fitted)) + canonical_json(fitted).count('"') <= room_for_a_few
    assert_valid(fitted)


def test_zombie_parents_come_before_the_zombies_and_other_rows() -> None:
    zombie_parent = proc(400, reasons=["ancestor"])
    zombies = [proc(500 + i, ppid=400, state="Z", reasons=["zombie"], cmdline=[]) for i in range(5)]
    others = [proc(600 + i, ppid=1, reasons=["descendant"], cmdline=["x", CONTROL]) for i in range(5)]
    document = snapshot("budget", processes=[zombie_parent, *zombies, *others])
    frame = len(canonical_json({**document, "processes": []})) + 300
    fitted = fit_snapshot(document, max_bytes=frame + len(canonical_json(zombie_parent)) * 3)
    kept = {row["pid"] for row in fitted["processes"]}
    assert 400 in kept and not kept & {r["pid"] for r in others}


def test_the_signed_message_as_sent_stays_under_the_limit() -> None:
    key = generate_private_key()
    document = holders_under_a_launcher(60, argument='"\\' * 2000)  # each byte escaped twice in the envelope
    for limit in (32 * 1024, 100 * 1024, 1024 * 1024):
        message = seal_snapshot(document, key, max_bytes=limit)
        assert envelope_size(message) <= limit
        body = json.loads(message["text"])
        assert_valid(body)
        assert len(body["processes"]) + body.get("left_out", {}).get("processes", 0) == 61
