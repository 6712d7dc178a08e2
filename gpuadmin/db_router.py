"""Pages read from a PostgreSQL streaming replica where a stale read is harmless (docs/deploy.md).

Used only when GPUADMIN_DATABASE_REPLICA_URL is set (gpuadmin/settings.py adds the ``replica``
alias, this router and the middleware below); without it everything reads and writes ``default``.

The rule: a read goes to the replica only when all of these hold, else to the primary:

- the request is a GET or HEAD of one of REPLICA_PAGES, the read-only views of the fleet and of
  usage (the fleet page, a host's and a process's page, their API lists and history, the usage
  report), which only show what the agents reported and are wrong by at most the replica's lag;
- the model belongs to one of REPLICA_APPS (fleet, usage): sign-in, sessions, API tokens, sudo,
  roles, kill requests and approvals, the audit chain, notifications and fair use are always read
  on the primary, even while such a page renders (a role just taken away, a kill just approved or an
  audit event just written is never missed);
- no transaction is open on the primary, and nothing was written yet in this request: a read inside
  a transaction or after a write sees the primary's rows, so no decision is made on stale ones.

Writes always go to the primary; migrations run only there (the replica follows by streaming).
A kill, an approval, a sign-in and every POST therefore never touch the replica.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model
from django.http import HttpRequest, HttpResponseBase

REPLICA = "replica"
# URL names (gpuadmin/urls.py and the apps' urls) of the pages that only show reported state.
REPLICA_PAGES = frozenset({
    "fleet", "host_detail", "process_detail",
    "api_hosts", "api_host_detail", "api_host_history", "api_process_detail",
    "usage", "usage_csv", "usage_processes", "api_usage",
})
REPLICA_APPS = frozenset({"fleet", "usage"})
READ_METHODS = frozenset({"GET", "HEAD"})

# True while one of REPLICA_PAGES is being served and nothing was written yet.
_replica_reads = contextvars.ContextVar("gpuadmin_replica_reads", default=False)


def replica_reads_allowed() -> bool:
    return _replica_reads.get()


class ReplicaRouter:
    """Reads of REPLICA_APPS during REPLICA_PAGES go to the replica; everything else to the primary."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str:
        if (
            _replica_reads.get()
            and model._meta.app_label in REPLICA_APPS
            and not connections[DEFAULT_DB_ALIAS].in_atomic_block
        ):
            return REPLICA
        # Explicitly the primary: without an answer Django would follow the hint of an instance
        # read from the replica.
        return DEFAULT_DB_ALIAS

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        # What this request reads after a write must see it: the rest of the request reads the primary.
        _replica_reads.set(False)
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool | None:
        # One database: the replica is the primary's copy.
        aliases = {DEFAULT_DB_ALIAS, REPLICA}
        if obj1._state.db in aliases and obj2._state.db in aliases:
            return True
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == REPLICA else None


class ReplicaPagesMiddleware:
    """Marks a GET of one of REPLICA_PAGES for the replica, for the view and its rendering only."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        token = _replica_reads.set(False)
        try:
            return self.get_response(request)
        finally:
            _replica_reads.reset(token)

    def process_view(self, request: HttpRequest, view_func: Callable[..., Any], view_args: Any,
                     view_kwargs: Any) -> None:
        match = request.resolver_match
        if request.method in READ_METHODS and match is not None and match.url_name in REPLICA_PAGES:
            _replica_reads.set(True)
