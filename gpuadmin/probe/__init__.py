"""The host-side probe: reads one host (processes, GPUs, device holders) into a
snapshot document. A plain library: no Django, no Celery, no database.

`take_snapshot` and `ProbeConfig` are loaded on first use, so importing the
package (as the CLI and the kill executor do) costs nothing. The modules on
the CLI's path avoid `typing` and `socket` too: each costs the short-lived CLI
several milliseconds of start-up.
"""

from __future__ import annotations

__all__ = ["ProbeConfig", "take_snapshot"]

# typing.TYPE_CHECKING without importing typing (see above); type checkers read the names here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuadmin.probe.config import ProbeConfig
    from gpuadmin.probe.snapshot import take_snapshot


def __getattr__(name: str) -> object:
    if name == "take_snapshot":
        from gpuadmin.probe.snapshot import take_snapshot

        return take_snapshot
    if name == "ProbeConfig":
        from gpuadmin.probe.config import ProbeConfig

        return ProbeConfig
    raise AttributeError(f"module 'gpuadmin.probe' has no attribute {name!r}")
