"""GPU health findings (findings.gpu_health): each condition an admin acts on, with the numbers seen
and a one-line remedy; a field the GPU could not give (null) is never a condition. Pure: no database."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuadmin.fleet.findings.rules import XID_MEANINGS, FindingDraft, compute_findings
from gpuadmin.fleet.intake.validation import parse_snapshot
from gpuadmin.fleet.models import Finding
from gpuadmin.probe.gpus import GpuHealth
from tests.factories import gpu, snapshot

Kind = Finding.Kind
Severity = Finding.Severity
UNKNOWN = dict.fromkeys(GpuHealth.__slots__)


def health_document(**health: Any) -> dict[str, Any]:
    sick = gpu(1, uuid="GPU-sick")
    sick["health"] = {**UNKNOWN, **health}
    document = snapshot(gpus=[gpu(0), sick])
    parse_snapshot(json.dumps(document))  # what the tests feed is what central accepts
    return document


def health_findings(**health: Any) -> dict[str, FindingDraft]:
    drafts = [d for d in compute_findings(health_document(**health)) if d.kind == Kind.GPU_HEALTH]
    return {d.key.removeprefix("GPU-sick:"): d for d in drafts}


def test_a_gpu_that_cannot_say_or_is_healthy_has_no_finding() -> None:
    assert health_findings() == {}
    assert health_findings(temperature_celsius=60, power_draw_milliwatts=300_000,
                           power_limit_milliwatts=700_000, clock_event_reasons=["gpu_idle", "sw_power_cap"],
                           ecc_volatile_uncorrected_errors=0, ecc_aggregate_uncorrected_errors=3,
                           remapped_rows_correctable=2, remapped_rows_uncorrectable=0,
                           remapped_rows_pending=False, remapped_rows_failed=False,
                           retired_pages_pending=False, xid_errors=[]) == {}


def test_row_remapping_pending_says_the_rows_and_to_reset_when_idle() -> None:
    found = health_findings(remapped_rows_correctable=0, remapped_rows_uncorrectable=2,
                            remapped_rows_pending=True, remapped_rows_failed=False)

    draft = found["row_remapping_pending"]
    assert draft.severity == Severity.WARNING
    assert draft.title == (
        "GPU 1: row remapping pending (2 rows remapped for uncorrectable errors, 0 for correctable)")
    assert "reset the GPU when it is idle (nvidia-smi -r -i 1)" in draft.remedy
    assert draft.details["remapped_rows_uncorrectable"] == 2


def test_row_remapping_failed_is_critical() -> None:
    found = health_findings(remapped_rows_pending=False, remapped_rows_failed=True)
    assert found["row_remapping_failed"].severity == Severity.CRITICAL
    assert "replace it" in found["row_remapping_failed"].remedy


def test_uncorrectable_ecc_since_the_last_reset() -> None:
    found = health_findings(ecc_volatile_uncorrected_errors=3, ecc_aggregate_uncorrected_errors=7)

    draft = found["uncorrectable_ecc"]
    assert (draft.severity, draft.title) == (
        Severity.CRITICAL, "GPU 1: 3 uncorrectable ECC errors since the last reset, 7 over its lifetime")


def test_page_retirement_pending_on_an_older_gpu() -> None:
    found = health_findings(retired_pages_single_bit_ecc=4, retired_pages_double_bit_ecc=1,
                            retired_pages_pending=True)
    assert found["page_retirement_pending"].title == (
        "GPU 1: memory page retirement pending (1 double-bit, 4 single-bit pages retired)")


def test_thermal_and_power_throttling_show_temperature_and_watts() -> None:
    found = health_findings(
        temperature_celsius=93, power_draw_milliwatts=701_500, power_limit_milliwatts=700_000,
        clock_event_reasons=["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"])

    assert found["thermal_throttling"].title == (
        "GPU 1: clocks slowed down by heat at 93 °C (hw thermal slowdown)")
    assert found["power_throttling"].title == (
        "GPU 1: clocks slowed down by the power supply at 702 W of 700 W (power brake)")
    # hw_slowdown beside a thermal cause is that cause, not a second, power one.
    thermal_only = health_findings(clock_event_reasons=["hw_slowdown", "sw_thermal_slowdown"])
    assert "power_throttling" not in thermal_only
    assert "power_throttling" in health_findings(clock_event_reasons=["hw_slowdown"])
    assert health_findings(clock_event_reasons=["sw_power_cap"]) == {}  # the usual cap at full load


@pytest.mark.parametrize("xid", sorted(XID_MEANINGS))
def test_each_xid_an_admin_acts_on_has_its_meaning_and_remedy(xid: int) -> None:
    found = health_findings(xid_errors=[{"xid": xid, "count": 2, "last_seen_at": "2026-12-04T10:00:00Z"}])

    draft = found[f"xid_{xid}"]
    meaning, severity, remedy = XID_MEANINGS[xid]
    assert draft.title == f"GPU 1: XID {xid}, {meaning} (2 times, last at 2026-12-04T10:00:00Z)"
    assert (draft.severity, draft.remedy) == (severity, remedy)
    assert draft.details["count"] == 2


def test_xid_79_says_reboot_and_another_xid_is_information() -> None:
    found = health_findings(xid_errors=[{"xid": 79, "count": 1, "last_seen_at": "2026-12-04T10:00:00Z"},
                                        {"xid": 13, "count": 5, "last_seen_at": "2026-12-04T10:00:00Z"}])

    assert "reboot" in found["xid_79"].remedy
    assert found["xid_13"].severity == Severity.INFO
    assert "XID catalogue" in found["xid_13"].remedy
