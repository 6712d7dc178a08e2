"""Moved to ``gpuadmin.wire.kill_protocol`` (issue 31); only ``wire_time`` is still read from here.

gpuadmin/probe/gpus/ imports ``wire_time`` from this path while its GPU-health
work is in progress; once those two imports read ``gpuadmin.wire.timestamps``,
delete this module.
"""

from __future__ import annotations

from gpuadmin.wire.timestamps import wire_time

__all__ = ["wire_time"]
