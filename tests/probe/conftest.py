"""Fixtures for the probe's tests: real processes and a temporary "device" file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.probe.helpers import processes  # noqa: F401 - fixture


@dataclass(frozen=True)
class Device:
    """A temporary file standing in for /dev/nvidia0, and the glob that matches it alone."""

    path: str
    glob: str


@pytest.fixture
def device(tmp_path: Path) -> Device:
    path = tmp_path / "fake-nvidia0"
    path.write_bytes(b"")
    return Device(path=str(path), glob=str(tmp_path / "fake-nvidia*"))
