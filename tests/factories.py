"""Valid snapshot documents for tests that do not need a real probe: the one synthetic-host generator's
builders (``gpuadmin/fleet/synthetic.py``), named as the tests call them.

Build one with ``snapshot()`` and ``proc()``; tests that exercise the probe
itself use real processes instead (tests/probe). ``tests/ingesting.py`` sends
one through central's real path.
"""

from __future__ import annotations

import json
from typing import Any

from gpuadmin.fleet.synthetic import (
    BOOT_ID,
    GiB,
    container_owner,
    gpu,
    proc,
    slurm_owner,
    snapshot,
)

__all__ = ["BOOT_ID", "GiB", "container_owner", "gpu", "proc", "slurm_owner", "snapshot", "snapshot_json"]


def snapshot_json(*args: Any, **kwargs: Any) -> str:
    return json.dumps(snapshot(*args, **kwargs))
