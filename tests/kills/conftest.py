"""Fixtures for the kill request tests: a host with a snapshot, and a record of
the orders central sends to hosts. People with roles come from tests/people.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.kills.helpers import (  # noqa: F401 - killed, lab, sent: fixtures
    SentTasks,
    killed,
    lab,
    protect_like_the_lab,
    sent,
)


@pytest.fixture(autouse=True)
def _lab_protections(settings: Any) -> None:
    protect_like_the_lab(settings)


@pytest.fixture
def broker_down(monkeypatch, sent: SentTasks) -> Callable[[bool], None]:  # noqa: F811 - the fixture
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
