"""Fixtures for the fleet tests: ingest factory documents at chosen moments, capture what central sends."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpuadmin.celery import app
from gpuadmin.fleet.ingest import ingest_snapshot, receive_snapshot
from gpuadmin.fleet.models import Host
from tests.keys import accept, signed_snapshot
from tests.probe.helpers import processes  # noqa: F401 - fixture (real processes, for test_real_probe.py)


@pytest.fixture
def ingest() -> Callable[..., Host]:
    """ingest(document, received_after_seconds=1): store a factory document as central would."""
    return _ingest_way("verified")


@pytest.fixture(params=["verified", "signed"])
def ingest_both_ways(request: pytest.FixtureRequest) -> Callable[..., Host]:
    """As ``ingest``, once as a payload whose sender was verified (``ingest_snapshot``), once as its
    host's signed message (``receive_snapshot``: the host accepted first; from its second snapshot
    on, the host's reads go out with its lock, ``ingest.ReadAhead``)."""
    return _ingest_way(request.param)


def _ingest_way(way: str) -> Callable[..., Host]:
    accepted: set[str] = set()

    def _ingest(document: dict[str, Any], *, received_after_seconds: float = 1.0) -> Host:
        taken_at = datetime.fromisoformat(document["taken_at"])
        received_at = taken_at + timedelta(seconds=received_after_seconds)
        if way == "verified":
            return ingest_snapshot(json.dumps(document), received_at=received_at)
        name = document["host"]["name"]
        if name not in accepted:
            accept(name)
            accepted.add(name)
        host = receive_snapshot(signed_snapshot(document), received_at=received_at)
        assert host is not None
        return host

    return _ingest


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every task central sends, as {name, args, queue, expires}, instead of reaching a broker."""
    calls: list[dict[str, Any]] = []

    def send_task(name: str, *args: Any, **options: Any) -> None:
        calls.append({"name": name, "args": args, **options})

    monkeypatch.setattr(app, "send_task", send_task)
    return calls
