"""Fixtures for the audit tests: people they name themselves, events, the sample log."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from gpuadmin.audit import log
from gpuadmin.audit.models import Action, AuditEvent
from tests.audit.helpers import SAMPLE, record_at
from tests.people import make_person


@pytest.fixture
def make_user(django_user_model) -> Callable[..., User]:
    """``make_user(username, *roles)``: tests here name their own people (alice, bob)."""
    return make_person


@pytest.fixture
def record_events() -> Callable[..., list[AuditEvent]]:
    """Append ``count`` simple events (host gpu1, request 1) and return them."""

    def record(count: int, **fields) -> list[AuditEvent]:
        fields.setdefault("host_name", "gpu1")
        fields.setdefault("kill_request_id", 1)
        action = fields.pop("action", Action.REQUESTED)
        return [log.record(action, **fields) for _ in range(count)]

    return record


@pytest.fixture
def sample_log(db: None, monkeypatch: pytest.MonkeyPatch) -> dict:
    for when, action, host, requester, approver, owners, request_id in SAMPLE.values():
        record_at(
            monkeypatch,
            when,
            action,
            host_name=host,
            requester_name=requester,
            approver_name=approver,
            process_users=owners,
            kill_request_id=request_id,
            targets_summary=f"pid {4000 + request_id} python ({owners[0]})",
        )
    return SAMPLE


@pytest.fixture(autouse=True)
def anchor_file(settings, tmp_path):
    """Each test's own anchor file: anchors written by one test never vouch for another's log."""
    settings.GPUADMIN_AUDIT_ANCHOR_FILE = tmp_path / "audit-anchors.jsonl"
    return settings.GPUADMIN_AUDIT_ANCHOR_FILE
