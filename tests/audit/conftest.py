from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction

from gpuadmin.audit import log
from gpuadmin.audit.models import Action, AuditEvent
from tests.audit.pg_flush import allow_test_flush_through_audit_triggers
from tests.audit.sample_log import sample_log  # noqa: F401 - fixture
from tests.people import (
    _fast_password_hashing,  # noqa: F401 - autouse fixture
    make_person,
)

allow_test_flush_through_audit_triggers()

# Deselected on SQLite by tests/conftest.py.
postgres_only = pytest.mark.postgres


def tamper(sql: str, params: tuple = ()) -> None:
    """Change the audit table behind the application's back, as someone with SQL access would.

    On PostgreSQL the triggers stop that, so first switch them off for this
    transaction, as a superuser could.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL session_replication_role = origin")


def audit_table() -> str:
    return connection.ops.quote_name(AuditEvent._meta.db_table)


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
