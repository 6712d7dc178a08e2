"""How central writes quantities for people (titles, messages)."""

from __future__ import annotations

_BINARY_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def human_bytes(size_bytes: int) -> str:
    """``12 GiB``, ``1.5 GiB``, ``512 MiB``, ``10 bytes``: one decimal at most, none when it is 0."""
    for unit, factor in _BINARY_UNITS:
        if abs(size_bytes) >= factor:
            text = f"{size_bytes / factor:.1f}"
            return f"{text.removesuffix('.0')} {unit}"
    return f"{size_bytes} bytes" if size_bytes != 1 else "1 byte"
