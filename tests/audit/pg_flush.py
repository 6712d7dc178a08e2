"""Let Django's test flush empty the audit table on PostgreSQL.

``transaction=True`` tests end with ``manage.py flush``, a TRUNCATE of every
table, which the audit triggers rightly refuse in production. For the flush
only, the session runs as a replica (``session_replication_role``, a superuser
setting, which the test database user is), so ordinary triggers do not fire.
``SET LOCAL`` ends with the flush's own transaction; nothing else changes.

The root conftest should call :func:`allow_test_flush_through_audit_triggers`
so every app's transactional tests can flush; tests/audit/conftest.py calls it too.
"""

from __future__ import annotations

import functools

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
