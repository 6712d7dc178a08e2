"""A pytest plugin (``-p tests.interrupt``, in pyproject.toml's addopts): a SIGTERM ends a test run as
Ctrl+C does, in the controller and in each xdist worker.

``timeout(1)`` or a cancelled job sends SIGTERM, whose default ends pytest and its xdist workers at
once: the servers and workers the tests started in sessions of their own (tests/services.py) then
outlive the run. As a KeyboardInterrupt, pytest tears the fixtures down first, and they stop them.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: the run ends, its fixtures torn down")


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():  # only it may set a handler
        signal.signal(signal.SIGTERM, _interrupt)
