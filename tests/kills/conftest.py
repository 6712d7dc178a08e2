"""Fixtures for the kill request tests: a host with a snapshot, and a record of
the orders central sends to hosts. People with roles come from tests/people.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from gpuadmin.fleet.models import Host, LatestSnapshot
from tests.kills.lab import lab_snapshot
from tests.people import _fast_password_hashing  # noqa: F401 - autouse fixture


@pytest.fixture(autouse=True)
def _lab_protections(settings) -> None:
    settings.GPUADMIN_PROTECTED_USERS = ["postgres"]
    settings.GPUADMIN_PROTECTED_UIDS = []
    settings.GPUADMIN_PROTECTED_COMMAND_PATTERNS = [r"^sshd\b"]
    settings.GPUADMIN_ALLOW_SELF_APPROVAL = False


def store_snapshot(document: dict[str, Any], *, received_at: datetime | None = None) -> Host:
    """Make ``document`` the host's latest snapshot, as ingest would (without findings or history)."""
    received_at = received_at or timezone.now()
    taken_at = datetime.fromisoformat(document["taken_at"])
    host, _ = Host.objects.get_or_create(name=document["host"]["name"])
    host.last_seen_at = received_at
    host.last_snapshot_taken_at = taken_at
    host.boot_id = document["host"]["boot_id"]
    host.save()
    LatestSnapshot.objects.update_or_create(
        host=host, defaults={"taken_at": taken_at, "received_at": received_at, "document": document}
    )
    return host


@pytest.fixture
def lab(db: None) -> Host:
    """The lab host, its latest snapshot taken a minute ago."""
    return store_snapshot(lab_snapshot(taken_at=timezone.now() - timedelta(seconds=60)))


class SentTasks(list):
    """Every task central published: (name, args, kwargs)."""

    def orders(self) -> list[dict[str, Any]]:
        return [args[0] for name, args, _ in self if name == "gpuadmin.agent.execute_kill_order"]


@pytest.fixture
def sent(monkeypatch) -> SentTasks:
    """Capture what central publishes instead of talking to a broker (the broker is not under test here).

    Notification tasks (``gpuadmin.notify.*``, queued after each change commits) are left out:
    tests/notify covers them, and the workflow's tests count orders.
    """
    from gpuadmin.celery import app
    from gpuadmin.task_names import NOTIFY_KILL_EVENT

    record = SentTasks()

    def fake_send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        if name != NOTIFY_KILL_EVENT:
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
