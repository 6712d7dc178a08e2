"""Fixtures for the fleet tests: ingest factory documents at chosen moments, capture what central sends."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpuadmin.celery import app
from gpuadmin.fleet.models import Host
from tests.keys import deliver
from tests.probe.helpers import processes  # noqa: F401 - fixture (real processes, for test_real_probe.py)


@pytest.fixture
def ingest() -> Callable[..., Host]:
    """ingest(document, received_after_seconds=1): store a factory document as central does, as its
    host's signed message (``tests.keys.deliver``: a new host offers its key and is accepted first)."""

    def _ingest(document: dict[str, Any], *, received_after_seconds: float = 1.0) -> Host:
        taken_at = datetime.fromisoformat(document["taken_at"])
        # Its JSON text in the document's own key order, as tests that show the stored text expect.
        return deliver(json.dumps(document), received_at=taken_at + timedelta(seconds=received_after_seconds))

    return _ingest


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every task central sends through ``send_task``, as {name, args, queue, expires}, instead of
    reaching a broker."""
    calls: list[dict[str, Any]] = []

    def send_task(name: str, *args: Any, **options: Any) -> None:
        calls.append({"name": name, "args": args, **options})

    monkeypatch.setattr(app, "send_task", send_task)
    return calls
