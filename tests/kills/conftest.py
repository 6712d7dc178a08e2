"""Fixtures for the kill request tests: a host with a snapshot, and a record of
the orders central sends to hosts. People with roles come from tests/people.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from gpuadmin.fleet.models import Host
from gpuadmin.task_names import EXECUTE_KILL_ORDER
from tests.kills.helpers import lab_snapshot, store_snapshot


@pytest.fixture(autouse=True)
def _lab_protections(settings) -> None:
    settings.GPUADMIN_PROTECTED_USERS = ["postgres"]
    settings.GPUADMIN_PROTECTED_UIDS = []
    settings.GPUADMIN_PROTECTED_COMMAND_PATTERNS = [r"^sshd\b"]
    settings.GPUADMIN_ALLOW_SELF_APPROVAL = False


@pytest.fixture
def lab(db: None) -> Host:
    """The lab host, its latest snapshot taken a minute ago."""
    return store_snapshot(lab_snapshot(taken_at=timezone.now() - timedelta(seconds=60)))


class SentTasks(list):
    """Every task central published: (name, args, kwargs)."""

    def orders(self) -> list[dict[str, Any]]:
        return [args[0] for name, args, _ in self if name == EXECUTE_KILL_ORDER]


@pytest.fixture
def sent(monkeypatch) -> SentTasks:
    """Capture what central publishes instead of talking to a broker (the broker is not under test here)."""
    from gpuadmin.celery import app

    record = SentTasks()

    def fake_send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        record.append((name, args, options))

    monkeypatch.setattr(app, "send_task", fake_send_task)
    return record


@pytest.fixture
def broker_down(monkeypatch, sent: SentTasks) -> Callable[[bool], None]:
    """broker_down(True) makes every publish fail as a refused connection would; sends land in ``sent``."""
    from gpuadmin.celery import app

    state = {"down": False}
    original = app.send_task

    def flaky_send_task(*args: Any, **kwargs: Any) -> Any:
        if state["down"]:
            raise ConnectionRefusedError(111, "Connection refused")
        return original(*args, **kwargs)

    monkeypatch.setattr(app, "send_task", flaky_send_task)
    return lambda down: state.__setitem__("down", down)


@pytest.fixture
def approve_committed(django_capture_on_commit_callbacks) -> Callable[..., Any]:
    """approve_committed(kill_request, user, **kw): approve, then run what waits for the commit (the send)."""
    from gpuadmin.kills import services

    def _approve(kill_request: Any, user: User, **kwargs: Any) -> Any:
        with django_capture_on_commit_callbacks(execute=True):
            return services.approve(kill_request.pk, user, **kwargs)

    return _approve
