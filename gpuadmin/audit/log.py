"""Recording audit events: the only way an event gets written.

Call :func:`record` inside the transaction that makes the change it describes,
so the event commits (or rolls back) with it::

    from gpuadmin.audit import log
    from gpuadmin.audit.models import Action

    with transaction.atomic():
        kill_request.transition(Status.APPROVED)
        kill_request.save()
        log.record(Action.APPROVED, actor=user, kill_request_id=kill_request.pk,
                   host_name=kill_request.host.name)

Appends are serialised so two writers never chain onto the same event: on
PostgreSQL a transaction-scoped advisory lock is taken before reading the head
of the chain; SQLite allows one writer at a time already (the project opens
its transactions IMMEDIATE). The unique ``sequence`` is the backstop: a writer
that somehow read a stale head fails instead of forking the chain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import connections, router, transaction
from django.utils import timezone

from gpuadmin.audit.chain import GENESIS_HASH, canonical_json
from gpuadmin.audit.models import Action, AuditEvent

# A fixed 64-bit key for pg_advisory_xact_lock, derived from a name so it does
# not collide with another application's small integers.
CHAIN_LOCK_KEY = int.from_bytes(hashlib.sha256(b"gpuadmin.audit.chain").digest()[:8], "big", signed=True)

# PostgreSQL text cannot hold NUL; a process-supplied name could. Keep the
# event (and the change it belongs to) rather than fail on it.
_NUL_REPLACEMENT = "\N{REPLACEMENT CHARACTER}"


def _text(value: Any) -> str:
    return str(value).replace("\x00", _NUL_REPLACEMENT) if value is not None else ""


def _user_list(process_users: Iterable[str] | str) -> str:
    if isinstance(process_users, str):
        process_users = process_users.split(",")
    names = {_text(u).strip() for u in process_users}
    return ",".join(sorted(n for n in names if n))


def _details_json(details: Mapping[str, Any] | None) -> str:
    try:
        return canonical_json(dict(details or {}))
    except (TypeError, ValueError) as error:
        raise ValueError(f"audit details must be JSON-serialisable (no NaN/Infinity): {error}") from error


def _lock_chain(using: str) -> None:
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CHAIN_LOCK_KEY])


def record(
    action: Action | str,
    *,
    actor: User | AnonymousUser | None = None,
    kill_request_id: int | None = None,
    host_name: str = "",
    requester_name: str = "",
    approver_name: str = "",
    process_users: Iterable[str] | str = (),
    targets_summary: str = "",
    details: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append one event to the chain and return it."""
    if action not in Action.values:
        raise ValueError(f"unknown audit action {action!r}; expected one of {', '.join(Action.values)}")
    if actor is not None and not actor.is_authenticated:
        actor = None
    fields: dict[str, Any] = {
        "created_at": timezone.now(),
        "actor_name": _text(actor.get_username()) if actor is not None else "",
        "action": str(action),
        "kill_request_id": int(kill_request_id) if kill_request_id is not None else None,
        "host_name": _text(host_name),
        "requester_name": _text(requester_name),
        "approver_name": _text(approver_name),
        "process_users": _user_list(process_users),
        "targets_summary": _text(targets_summary),
        "details_json": _details_json(details),
    }
    using = router.db_for_write(AuditEvent)
    # Inside the caller's transaction without a savepoint: an event that cannot be
    # written must undo the change it describes. (Savepoints would also pile up
    # subtransactions when one transaction records many events.)
    with transaction.atomic(using=using, savepoint=False):
        _lock_chain(using)
        head = AuditEvent.objects.using(using).order_by("-sequence").values_list("sequence", "hash").first()
        sequence, previous_hash = (head[0] + 1, head[1]) if head else (1, GENESIS_HASH)
        fields.update(sequence=sequence, previous_hash=previous_hash)
        event = AuditEvent(actor=actor, **fields)
        event.hash = event.computed_hash()
        event.save(using=using)
    return event


def summarize_targets(targets: Sequence[Mapping[str, Any]]) -> str:
    """'pid 4120 python (alice) +2' from targets with pid, name and user keys."""
    if not targets:
        return ""
    first = targets[0]
    name = f" {first['name']}" if first.get("name") else ""
    text = f"pid {first.get('pid', '?')}{name} ({first.get('user') or '?'})"
    if len(targets) > 1:
        text += f" +{len(targets) - 1}"
    return _text(text)
