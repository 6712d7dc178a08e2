"""What the host page's GPU cards show beyond memory: each GPU's health, as label and value lines
written once here from the snapshot document (docs/snapshot.md, ``gpus[].health``).

A field the GPU could not give (null) shows no line: unknown is never drawn as zero. A line
that needs an admin's attention is marked ``alert`` (the findings above the cards say why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuadmin.fleet.findings.rules import HW_SLOWDOWN_REASON, POWER_BRAKE_REASON, THERMAL_REASONS, watts_text


@dataclass(frozen=True)
class HealthLine:
    label: str
    value: str
    alert: bool = False


def health_lines(document: dict[str, Any]) -> dict[str, list[HealthLine]]:
    """GPU uuid -> its health lines, for the GPUs whose backend says anything of health."""
    return {gpu["uuid"]: _lines(gpu["health"]) for gpu in document.get("gpus", ()) if gpu.get("health")}


def _lines(health: dict[str, Any]) -> list[HealthLine]:
    lines: list[HealthLine] = []
    reasons = health.get("clock_event_reasons")
    slowed = reasons is not None and any(
        r in (*THERMAL_REASONS, POWER_BRAKE_REASON, HW_SLOWDOWN_REASON) for r in reasons)
    temperature = health.get("temperature_celsius")
    if temperature is not None:
        lines.append(HealthLine("Temperature", f"{temperature} °C",
                                alert=bool(reasons and any(r in THERMAL_REASONS for r in reasons))))
    draw, limit = health.get("power_draw_milliwatts"), health.get("power_limit_milliwatts")
    if draw is not None or limit is not None:
        lines.append(HealthLine("Power", f"{watts_text(draw)} of {watts_text(limit)}",
                                alert=bool(reasons and POWER_BRAKE_REASON in reasons)))
    if reasons is not None:
        named = ", ".join(r.replace("_", " ") for r in reasons)
        lines.append(HealthLine("Clocks held by", named or "nothing", alert=slowed))
    ecc = [health.get(f"ecc_{when}_{kind}_errors") for when in ("volatile", "aggregate")
           for kind in ("uncorrected", "corrected")]
    if any(v is not None for v in ecc):
        lines.append(HealthLine(
            "ECC errors", f"since reset {_n(ecc[0])} uncorrectable, {_n(ecc[1])} corrected; "
                          f"lifetime {_n(ecc[2])} / {_n(ecc[3])}",
            alert=bool(ecc[0])))
    rows = [health.get(f"remapped_rows_{k}") for k in ("uncorrectable", "correctable", "pending", "failed")]
    if any(v is not None for v in rows):
        states = [word for word, flag in (("pending", rows[2]), ("FAILED", rows[3])) if flag]
        lines.append(HealthLine(
            "Remapped rows", f"{_n(rows[0])} uncorrectable, {_n(rows[1])} correctable"
                             + (f"; {', '.join(states)}" if states else ""),
            alert=bool(states)))
    pages = [health.get(f"retired_pages_{k}") for k in ("double_bit_ecc", "single_bit_ecc", "pending")]
    if any(v is not None for v in pages):
        lines.append(HealthLine(
            "Retired pages", f"{_n(pages[0])} double-bit, {_n(pages[1])} single-bit"
                             + ("; pending" if pages[2] else ""),
            alert=bool(pages[2])))
    xids = health.get("xid_errors")
    if xids is not None:
        lines.append(HealthLine(
            "XID errors", "; ".join(f"{x['xid']} x{x['count']} (last {x['last_seen_at']})" for x in xids)
            or "none seen", alert=bool(xids)))
    return lines


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)
