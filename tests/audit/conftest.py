from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction

from gpuadmin.accounts.roles import Role
from gpuadmin.audit import log
from gpuadmin.audit.models import Action, AuditEvent
from tests.audit.pg_flush import allow_test_flush_through_audit_triggers
from tests.audit.sample_log import sample_log  # noqa: F401 - fixture
from tests.web.people import (  # noqa: F401 - fixtures
    _fast_password_hashing,
    stranger,
    viewer,
    viewer_client,
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
def make_user(django_user_model) -> Callable:
    def make(username: str, *roles: Role):
        user = django_user_model.objects.create_user(username=username, password="pw-" + username)
        for role in roles:
            user.groups.add(Group.objects.get(name=role.value))
        return user

    return make


@pytest.fixture
def record_events() -> Callable[..., list[AuditEvent]]:
    """Append ``count`` simple events (host gpu1, request 1) and return them."""

    def record(count: int, **fields) -> list[AuditEvent]:
        fields.setdefault("host_name", "gpu1")
        fields.setdefault("kill_request_id", 1)
        action = fields.pop("action", Action.REQUESTED)
        return [log.record(action, **fields) for _ in range(count)]

    return record
