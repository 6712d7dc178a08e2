"""Template filters for what the pages show: bytes, ages, roles, and untrusted
text from processes made visible instead of interpreted (see untrusted_text.py).

Anything that comes from a GPU host (command line, process name, user name,
container id) is chosen by whoever runs the process there: show it through
``visible_controls`` (or ``visible_controls_text`` inside an attribute).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe

from gpuadmin.accounts.roles import Role, role_names
from gpuadmin.web.untrusted_text import visible_text, visible_text_parts

register = template.Library()

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(value: int | float | None) -> str:
    """1536 -> '1.5 KiB'; 12 * 2**30 -> '12.0 GiB'; None -> '—' (not known)."""
    if value is None or value == "":
        return "—"
    amount = float(value)
    for unit in _BYTE_UNITS:
        if abs(amount) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{int(amount)} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_duration(seconds: int | float | None) -> str:
    """An age in the two largest units: '42 s', '5 min 3 s', '3 h 12 min', '2 d 4 h'."""
    if seconds is None or seconds == "":
        return "—"
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    parts: list[tuple[int, str]] = []
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        parts.append((total // size, unit))
        total %= size
    # Start at the largest non-zero unit and keep the next one when it is not zero.
    first = next(i for i, (n, _) in enumerate(parts) if n)
    shown = [parts[first]]
    if first + 1 < len(parts) and parts[first + 1][0]:
        shown.append(parts[first + 1])
    return " ".join(f"{n} {unit}" for n, unit in shown)


# The /proc/<pid>/stat state letters (proc(5)).
PROCESS_STATES = {
    "R": "running", "S": "sleeping", "D": "uninterruptible (disk) sleep", "Z": "zombie",
    "T": "stopped", "t": "stopped by a debugger", "X": "dead", "I": "idle kernel thread",
    "P": "parked", "W": "paging", "K": "wakekill",
}


@register.filter
def state_name(letter: Any) -> str:
    return PROCESS_STATES.get(str(letter), "unknown state")


@register.filter
def bytes_human(value: Any) -> str:
    return format_bytes(value)


@register.filter
def duration(value: Any) -> str:
    return format_duration(value)


@register.filter(is_safe=False)
def visible_controls(value: Any) -> SafeString:
    """Escape ``value`` for HTML and show its control characters as marked escapes.

    The result is built only from ``conditional_escape``d pieces and fixed
    markup, so it is safe whatever the input; it is escaped even where a
    template turned auto-escaping off, because the input is never trusted.
    """
    if value is None:
        return mark_safe("")
    out: list[str] = []
    for is_control, piece in visible_text_parts(str(value)):
        if is_control:
            out.append(format_html('<span class="ctl" title="control character">{}</span>', piece))
        else:
            out.append(conditional_escape(piece))
    return mark_safe("".join(out))  # noqa: S308 - every piece above is escaped


@register.filter
def visible_controls_text(value: Any) -> str:
    """Plain-text form of ``visible_controls`` for attributes (title=...): escapes as text, auto-escaped."""
    return "" if value is None else visible_text(str(value))


@register.filter
def role_label(user: Any) -> str:
    """The user's roles in the order viewer, requester, approver: 'viewer, requester'."""
    names = role_names(user)
    return ", ".join(r.value for r in Role if r.value in names)


@register.filter
def has_role(user: Any, role: str) -> bool:
    return role in role_names(user)


@register.filter
def percent_of(part: Any, whole: Any) -> float:
    """part / whole as a percentage clamped to 0..100, for bar widths (0 when unknown)."""
    try:
        ratio = 100.0 * float(part) / float(whole)
    except (TypeError, ValueError, ZeroDivisionError):
        return 0.0
    return max(0.0, min(100.0, ratio))


@register.filter
def of_gpu(by_uuid: Any, gpu: Any) -> Any:
    """What a mapping keyed by GPU uuid holds for this GPU (the host page's MIG instances); () if nothing."""
    return by_uuid.get(gpu.uuid, ()) if hasattr(by_uuid, "get") else ()


@register.filter
def memory_bar(gpu: Any) -> dict[str, str]:
    """Everything a GPU memory bar shows, formatted once (the fleet page draws one per GPU).

    The bar has two parts, attributed then unattributed memory. Attributed is
    capped at used: the two are read at slightly different moments, and the bar
    must never claim more than the GPU reports.
    """
    total = getattr(gpu, "memory_total_bytes", None)
    used_bytes = getattr(gpu, "memory_used_bytes", None)
    used = used_bytes or 0
    attributed = min(getattr(gpu, "memory_attributed_bytes", 0) or 0, used)
    unattributed = used - attributed
    attributed_percent = percent_of(attributed, total)
    unattributed_percent = min(percent_of(unattributed, total), 100.0 - attributed_percent)
    utilization = getattr(gpu, "utilization_percent", None)
    title = (
        f"GPU {gpu.index}: {format_bytes(used_bytes)} used of {format_bytes(total)}; "
        f"{format_bytes(unattributed)} not attributed to any visible process"
    )
    if utilization is not None:
        title += f"; {utilization}% busy"
    return {
        "attributed_percent": f"{attributed_percent:.1f}",
        "unattributed_percent": f"{unattributed_percent:.1f}",
        "used_percent": f"{percent_of(used, total):.0f}",
        "used": format_bytes(used_bytes),
        "total": format_bytes(total),
        "unattributed": format_bytes(unattributed) if unattributed else "",
        "title": title,
    }


@register.filter
def join_visible(values: Iterable[Any], separator: str = ", ") -> SafeString:
    """Like ``join`` but each item goes through ``visible_controls``."""
    return mark_safe(conditional_escape(separator).join(visible_controls(v) for v in values))  # noqa: S308
