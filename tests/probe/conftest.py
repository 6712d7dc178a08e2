"""Fixtures for the probe's tests: real processes, a temporary "device" file, the kill journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuadmin.probe.journal import Journal
from tests.probe.helpers import Device, processes  # noqa: F401 - processes: fixture


@pytest.fixture
def device(tmp_path: Path) -> Device:
    path = tmp_path / "fake-nvidia0"
    path.write_bytes(b"")
    return Device(path=str(path), glob=str(tmp_path / "fake-nvidia*"))


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "agent-journal")
