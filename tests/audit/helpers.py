"""Helpers the audit tests share: a known sample log, tampering behind the application's back,
and the flush that PostgreSQL's audit triggers must let through in tests.

The flush: Django's test flush must empty the audit table on PostgreSQL.

``transaction=True`` tests end with ``manage.py flush``, a TRUNCATE of every
table, which the audit triggers rightly refuse in production. For the flush
only, the session runs as a replica (``session_replication_role``, a superuser
setting, which the test database user is), so ordinary triggers do not fire.
``SET LOCAL`` ends with the flush's own transaction; nothing else changes.

tests/conftest.py calls :func:`allow_test_flush_through_audit_triggers` so every
app's transactional tests can flush.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.utils import timezone

from gpuadmin.audit import log
from gpuadmin.audit.models import Action, AuditEvent

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


# --- the sample log (the `sample_log` fixture in tests/audit/conftest.py records it) ---
# sequence: (time, action, host, requester, approver, process owners, request)
SAMPLE = {
    1: (datetime(2025, 3, 1, 10, 0, tzinfo=UTC), Action.REQUESTED, "gpu1", "alice", "", ["carol"], 1),
    2: (datetime(2025, 3, 1, 10, 5, tzinfo=UTC), Action.APPROVED, "gpu1", "alice", "bob", ["carol"], 1),
    3: (datetime(2025, 3, 2, 9, 0, tzinfo=UTC), Action.SIGNAL_SENT, "gpu1", "alice", "bob", ["carol"], 1),
    4: (datetime(2025, 3, 3, 12, 0, tzinfo=UTC), Action.REQUESTED, "gpu2", "dave", "", ["carol", "erin"], 2),
    5: (datetime(2025, 3, 4, 8, 0, tzinfo=UTC), Action.REJECTED, "gpu2", "dave", "bob", ["erin"], 2),
    # "caroline" must not match a filter for "carol".
    6: (datetime(2025, 3, 5, 0, 30, tzinfo=UTC), Action.REQUESTED, "gpu2", "alice", "", ["caroline"], 3),
}


def record_at(monkeypatch: pytest.MonkeyPatch, when: datetime, action: str, **fields) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(timezone, "now", lambda: when)
        log.record(action, **fields)


# (query, sequences expected, newest first)
FILTER_CASES = [
    ({}, [6, 5, 4, 3, 2, 1]),
    ({"host": "gpu2"}, [6, 5, 4]),
    ({"requester": "alice"}, [6, 3, 2, 1]),
    ({"approver": "bob"}, [5, 3, 2]),
    ({"process_user": "carol"}, [4, 3, 2, 1]),
    ({"process_user": "erin"}, [5, 4]),
    ({"action": "requested"}, [6, 4, 1]),
    ({"kill_request": "2"}, [5, 4]),
    ({"from": "2025-03-02", "to": "2025-03-04"}, [5, 4, 3]),
    ({"from": "2025-03-05"}, [6]),
    ({"to": "2025-03-01"}, [2, 1]),
    ({"host": "gpu2", "process_user": "erin", "action": "rejected"}, [5]),
    ({"host": "gpu3"}, []),
]
FILTER_IDS = ["none", "host", "requester", "approver", "owner", "owner2", "action", "request", "dates",
              "from", "to", "combined", "nothing"]


# --- the flush -----------------------------------------------------------------------
SET_REPLICA = "SET LOCAL session_replication_role = replica"


def allow_test_flush_through_audit_triggers() -> None:
    try:
        from django.db.backends.postgresql.operations import DatabaseOperations
    except ImportError:  # no psycopg: no PostgreSQL runs either
        return
    original = DatabaseOperations.execute_sql_flush
    if getattr(original, "lets_audit_flush", False):
        return

    @functools.wraps(original)
    def execute_sql_flush(self, sql_list):
        return original(self, [SET_REPLICA, *sql_list] if sql_list else sql_list)

    execute_sql_flush.lets_audit_flush = True
    DatabaseOperations.execute_sql_flush = execute_sql_flush
