"""Helpers for the fleet tests: ingest factory documents at chosen moments, capture what central sends."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuadmin.celery import app
from gpuadmin.fleet.ingest import ingest_snapshot
from gpuadmin.fleet.models import Host
from tests.probe.helpers import processes  # noqa: F401 - fixture (real processes, for test_real_probe.py)

# A fixed moment, so that every test reads the same taken_at / received_at.
T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def ingest() -> Callable[..., Host]:
    """ingest(document, received_after_seconds=1): store a factory document as central would."""

    def _ingest(document: dict[str, Any], *, received_after_seconds: float = 1.0) -> Host:
        taken_at = datetime.fromisoformat(document["taken_at"])
        return ingest_snapshot(
            json.dumps(document), received_at=taken_at + timedelta(seconds=received_after_seconds)
        )

    return _ingest


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every task central sends, as {name, args, queue, expires}, instead of reaching a broker."""
    calls: list[dict[str, Any]] = []

    def send_task(name: str, *args: Any, **options: Any) -> None:
        calls.append({"name": name, "args": args, **options})

    monkeypatch.setattr(app, "send_task", send_task)
    return calls
