"""How central writes things for people, in one place: sizes, durations,
process states, clipped text and UTC times.

Pages use these through one-line template filters
(``gpuadmin.web.templatetags.gpuadmin_format``); finding titles, audit details,
API fields and messages call them directly, so a figure reads the same
wherever it appears. No Django here.
"""

from __future__ import annotations

from datetime import datetime
from typing import overload

from gpuadmin.wire.timestamps import wire_time

# Shown for a quantity that is not known (no GPU data, a process gone).
UNKNOWN = "—"

_BINARY_UNITS = (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
_DURATION_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))

# The /proc/<pid>/stat state letters (proc(5)), worded to follow "was" or "is".
PROCESS_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep (D)",
    "Z": "a zombie",
    "T": "stopped",
    "t": "stopped by a debugger",
    "X": "dead",
    "I": "an idle kernel thread",
    "P": "parked",
    "W": "paging",
    "K": "in wakekill",
}


def human_bytes(size_bytes: int | float | None) -> str:
    """``12 GiB``, ``1.5 GiB``, ``512 MiB``, ``10 B``, ``0 B``: binary units in one style (the unit
    always a symbol, as the charts' axes write it), one decimal at most, none when it is 0; ``—`` when
    not known."""
    if size_bytes is None:
        return UNKNOWN
    for unit, factor in _BINARY_UNITS:
        if abs(size_bytes) >= factor:
            text = f"{size_bytes / factor:.1f}"
            return f"{text.removesuffix('.0')} {unit}"
    return f"{int(size_bytes)} B"


def human_duration(seconds: int | float | None) -> str:
    """An age in the two largest units: '42 s', '5 min 3 s', '3 h 12 min', '2 d 4 h'; ``—`` when not known."""
    if seconds is None:
        return UNKNOWN
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    parts: list[tuple[int, str]] = []
    for size, unit in _DURATION_UNITS:
        parts.append((total // size, unit))
        total %= size
    # Start at the largest non-zero unit and keep the next one when it is not zero.
    first = next(i for i, (n, _) in enumerate(parts) if n)
    shown = [parts[first]]
    if first + 1 < len(parts) and parts[first + 1][0]:
        shown.append(parts[first + 1])
    return " ".join(f"{n} {unit}" for n, unit in shown)


def human_age(seconds: int | float | None) -> str:
    """How long ago, in the largest unit: 'just now', '42 s ago', '4 min ago', '3 h ago', '2 d ago';
    a negative age is in the future ('in 5 min'). static/js/ages.js words it the same way."""
    if seconds is None:
        return UNKNOWN
    future = seconds < 0
    total = abs(int(seconds))
    if total < 5:
        return "just now"
    size, unit = next((size, unit) for size, unit in _DURATION_UNITS if total >= size)
    amount = f"{total // size} {unit}"
    return f"in {amount}" if future else f"{amount} ago"


def process_state(letter: str) -> str:
    """The words for a process state letter: 'sleeping', 'a zombie', 'in state q' for one not in proc(5)."""
    return PROCESS_STATES.get(letter, f"in state {letter}")


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, the last one an ellipsis when anything was cut."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


@overload
def utc_text(moment: datetime, *, timespec: str = ...) -> str: ...
@overload
def utc_text(moment: None, *, timespec: str = ...) -> None: ...
def utc_text(moment: datetime | None, *, timespec: str = "auto") -> str | None:
    """ISO 8601 in UTC with a "Z": ``2026-01-02T03:04:05.120000Z``; None stays None.

    The kill protocol's form (``wire_time``), so a time reads the same on the
    wire, in the API and on the page. ``timespec`` as ``datetime.isoformat``:
    "auto" writes fractional digits only when the time has them; the audit log
    always writes "microseconds".
    """
    if moment is None:
        return None
    return wire_time(moment, timespec=timespec)
