"""Fit a snapshot under the size central accepts, so that a host never vanishes for being big.

Central rejects a snapshot over ``GPUADMIN_SNAPSHOT_MAX_BYTES`` (8 MiB by
default); a rejected snapshot leaves the host's page frozen and the host soon
offline. Command lines are the part a local user controls: 400 processes with
4 KiB of control characters each come to 400 x 24 KiB once escaped as JSON
(``\\u0001`` per byte), more than the limit. So the agent, before it signs:

1. cuts each command line to a per-row budget, counted as escaped JSON (what
   it costs in the message, not its raw length);
2. if the message is still too big, cuts every command line to a small budget;
3. if it is still too big, keeps rows by priority — GPU holders, device
   holders, D-state processes, zombies' parents, zombies, then the rest — each
   with the ancestors the process tree needs to place it, and leaves the others out.

What was cut or left out is said in the document (``left_out``, only present
when something was), so the page can show "N processes left out" instead of
pretending the host is smaller than it is.

Sizes are exact, not estimated: the budget is over the signed envelope as sealed
(``canonical_json(seal(...))``), where the snapshot's canonical text is a JSON
string, so each ``"`` and ``\\`` in it counts twice. It travels compressed
(``gpuadmin.sending.send_snapshot``), smaller still; central's limit is on the text.

Plain library: no Django, no Celery.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuadmin.wire.signing import MessageKind, canonical_json, seal

# Central's default limit (gpuadmin.settings reads GPUADMIN_SNAPSHOT_MAX_BYTES with this default,
# and so does the agent: one number on both sides).
DEFAULT_SNAPSHOT_MAX_BYTES = 8 * 1024 * 1024
# A command line's share of a row, as canonical (escaped) JSON: twice the raw cap of 4096 bytes,
# so a plain command line is never cut here, and one of control characters costs at most this.
CMDLINE_ROW_MAX_BYTES = 8192
# When the rows do not fit with that, every command line gets this much before any row is dropped:
# the tree of who holds the GPUs matters more than the tail of their arguments.
CMDLINE_TIGHT_MAX_BYTES = 512

# Priority tiers, most important first (a row's tier is its best reason).
_TIER_GPU, _TIER_DEVICE, _TIER_D_STATE, _TIER_ZOMBIE_PARENT, _TIER_ZOMBIE, _TIER_REST = range(6)


def escaped_size(text: str) -> int:
    """Bytes ``text`` (canonical JSON: ASCII, control characters already escaped) takes
    inside a JSON string: each quote and backslash is escaped once more."""
    return len(text) + text.count('"') + text.count("\\")


def envelope_size(message: dict[str, Any]) -> int:
    """The signed message's size as sent: its canonical JSON (ASCII, so characters are bytes)."""
    return len(canonical_json(message))


def seal_snapshot(document: dict[str, Any], key: Ed25519PrivateKey, *, max_bytes: int) -> dict[str, Any]:
    """The signed snapshot message, at most ``max_bytes`` as sent (``document`` is not changed).

    Should the message not fit even with no process rows (a limit of a few KiB),
    it goes as small as it gets, and central's rejection says why on the host's page.
    """
    overhead_bytes = _envelope_overhead(key)
    message = seal(fit_snapshot(document, max_bytes=max_bytes, overhead_bytes=overhead_bytes),
                   MessageKind.SNAPSHOT, key)
    excess = envelope_size(message) - max_bytes
    if excess > 0:  # the sizes above are exact; this only guards against a mistake in them
        budget = max_bytes - excess
        message = seal(fit_snapshot(document, max_bytes=budget, overhead_bytes=overhead_bytes),
                       MessageKind.SNAPSHOT, key)
    return message


def _envelope_overhead(key: Ed25519PrivateKey) -> int:
    """What the envelope adds around the escaped text: fixed for a key (the signature's length is)."""
    return envelope_size(seal("", MessageKind.SNAPSHOT, key)) - len('""')


def fit_snapshot(document: dict[str, Any], *, max_bytes: int, overhead_bytes: int = 0,
                 cmdline_row_max_bytes: int = CMDLINE_ROW_MAX_BYTES) -> dict[str, Any]:
    """A copy of ``document`` whose canonical text, escaped once more and with
    ``overhead_bytes`` added, is at most ``max_bytes`` (see the module's docstring)."""
    fitted = copy.deepcopy(document)
    rows: list[dict[str, Any]] = fitted["processes"]
    shortened = {row["pid"] for row in rows if _cut_cmdline(row, cmdline_row_max_bytes)}
    left_out: dict[str, Any] = {
        "processes": 0, "by_reason": {}, "cmdlines_shortened": len(shortened), "max_bytes": max_bytes,
    }
    fitted["left_out"] = left_out
    if _total_size(fitted, overhead_bytes) > max_bytes:
        shortened |= {row["pid"] for row in rows if _cut_cmdline(row, CMDLINE_TIGHT_MAX_BYTES)}
        left_out["cmdlines_shortened"] = len(shortened)
    if _total_size(fitted, overhead_bytes) > max_bytes:
        kept = _keep_by_priority(fitted, max_bytes - overhead_bytes)
        dropped = [row for row in rows if row["pid"] not in kept]
        fitted["processes"] = [row for row in rows if row["pid"] in kept]
        left_out["processes"] = len(dropped)
        left_out["by_reason"] = dict(sorted(Counter(r for row in dropped for r in row["reasons"]).items()))
        left_out["cmdlines_shortened"] = len(shortened & kept)
    if not left_out["processes"] and not left_out["cmdlines_shortened"]:
        # Only said when something was cut: a snapshot that fits is the document the probe took.
        del fitted["left_out"]
    return fitted


def _cut_cmdline(row: dict[str, Any], max_bytes: int) -> bool:
    """Cut ``row``'s command line so its canonical JSON is at most ``max_bytes``; True if it was cut."""
    argv: list[str] = row["cmdline"]
    if len(canonical_json(argv)) <= max_bytes:
        return False
    kept: list[str] = []
    used = len("[]")
    for argument in argv:
        cost = len(canonical_json(argument)) + (1 if kept else 0)  # its quotes, and a comma
        if used + cost <= max_bytes:
            kept.append(argument)
            used += cost
            continue
        room = max_bytes - used - (1 if kept else 0) - len('""')
        if room > 0:
            kept.append(_prefix_within(argument, room))
        break
    row["cmdline"] = kept
    row["cmdline_truncated"] = True
    return True


def _prefix_within(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose escaped form (without quotes) is at most ``max_bytes``."""
    # The escaped length grows with the prefix: bisect on it (a character at a time is
    # seconds for 400 hostile rows).
    low, high = 0, min(len(text), max_bytes)
    while low < high:
        middle = (low + high + 1) // 2
        if len(canonical_json(text[:middle])) - 2 <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _total_size(document: dict[str, Any], overhead_bytes: int) -> int:
    return overhead_bytes + escaped_size(canonical_json(document))


def _keep_by_priority(document: dict[str, Any], max_bytes: int) -> set[int]:
    """The PIDs of the rows to keep: by tier, each with its ancestors, while they fit."""
    rows: list[dict[str, Any]] = document["processes"]
    by_pid = {row["pid"]: row for row in rows}
    # Everything but the rows: the rows' array starts empty, each kept row adds itself and a comma.
    frame = {**document, "processes": []}
    left_out = frame["left_out"] = {**document["left_out"], "by_reason": _all_reasons_counted(rows)}
    left_out["processes"] = left_out["cmdlines_shortened"] = len(rows)  # the widest these numbers get
    used = _total_size(frame, 0) - 1  # the first row has no comma before it
    size = {pid: escaped_size(canonical_json(row)) + 1 for pid, row in by_pid.items()}

    zombie_parents = {row["ppid"] for row in rows if "zombie" in row["reasons"]}
    kept: set[int] = set()
    for row in sorted(rows, key=lambda r: (_tier(r, zombie_parents), r["pid"])):
        needed = [pid for pid in _chain(row["pid"], by_pid) if pid not in kept]
        cost = sum(size[pid] for pid in needed)
        if used + cost <= max_bytes:
            kept.update(needed)
            used += cost
    return kept


def _all_reasons_counted(rows: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(r for row in rows for r in row["reasons"]))


def _tier(row: dict[str, Any], zombie_parents: set[int]) -> int:
    reasons = row["reasons"]
    if "gpu" in reasons:
        return _TIER_GPU
    if "device" in reasons:
        return _TIER_DEVICE
    if "uninterruptible" in reasons:
        return _TIER_D_STATE
    if row["pid"] in zombie_parents:
        return _TIER_ZOMBIE_PARENT
    if "zombie" in reasons:
        return _TIER_ZOMBIE
    return _TIER_REST


def _chain(pid: int, by_pid: dict[int, dict[str, Any]]) -> list[int]:
    """``pid`` and its ancestors among the rows, up to the first one not in the document."""
    chain: list[int] = []
    while pid in by_pid and pid not in chain:
        chain.append(pid)
        pid = by_pid[pid]["ppid"]
    return chain
