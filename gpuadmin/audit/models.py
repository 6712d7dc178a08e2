"""The audit log: one append-only, hash-chained table of kill workflow and account events.

Each event copies the names it mentions (actor, host, requester, approver,
process owners) at write time, so history stays readable after users, hosts
and requests are gone, and it refers to its kill request by number only: the
log must never be constrained or changed by the rows it describes.

The application never updates or deletes an event. The one change allowed is
the database clearing ``actor`` when that user is deleted (``SET_NULL``):
``actor_name`` keeps who it was, and the hash never covered the foreign key.
On PostgreSQL, triggers (migration 0002) enforce the same below the ORM.

Events are written only by :func:`gpuadmin.audit.log.record`, which assigns the
next sequence and links the chain; ``AuditEvent.objects.verify()`` recomputes
it (the hashing itself is :mod:`gpuadmin.audit.chain`, which knows no model).
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import models

from gpuadmin.audit.chain import (
    HASHED_FIELDS,
    VERIFY_CHUNK_SIZE,
    VERIFY_COLUMNS,
    VerifyResult,
    check_rows,
    event_hash,
    timestamp_text,
)
from gpuadmin.wire import kill_protocol


class AppendOnlyError(Exception):
    """Raised when code tries to change or remove an audit event."""


# What the log records: what central did to a kill request, and, in between,
# every event the agent reported, with the words and labels of the kill protocol
# (gpuadmin/wire/kill_protocol.py), so a new event is added there only; then
# the decisions about whom to trust (host keys, messages refused: docs/security.md).
# mypy reads the functional enum API only for enum's own classes, not Django's Choices.
Action = models.TextChoices(  # type: ignore[call-overload]
    "Action",
    [
        ("REQUESTED", ("requested", "Requested")),
        ("APPROVED", ("approved", "Approved")),
        ("REJECTED", ("rejected", "Rejected")),
        ("CANCELLED", ("cancelled", "Cancelled")),
        ("EXPIRED", ("expired", "Expired")),
        ("DISPATCHED", ("dispatched", "Dispatched to host")),
        *kill_protocol.Event.members(),
        ("MEMORY_RELEASED", ("memory_released", "Memory released")),
        ("REPORT_CONFLICT", ("report_conflict", "Conflicting kill report")),
        ("HOST_KEY_OFFERED", ("host_key_offered", "Host key awaiting acceptance")),
        ("HOST_ACCEPTED", ("host_accepted", "Host key accepted")),
        ("HOST_KEY_FORGOTTEN", ("host_key_forgotten", "Host key forgotten")),
        ("MESSAGE_REJECTED", ("message_rejected", "Rejected message")),
        # Accounts, roles, API tokens and sign-in (gpuadmin/accounts/audit_trail.py);
        # the account concerned is details["user"].
        ("USER_CREATED", ("user_created", "Account created")),
        ("USER_CHANGED", ("user_changed", "Account changed")),
        ("USER_DELETED", ("user_deleted", "Account deleted")),
        ("ROLES_CHANGED", ("roles_changed", "Roles changed")),
        ("TOKEN_CREATED", ("token_created", "API token created")),
        ("TOKEN_REVOKED", ("token_revoked", "API token revoked")),
        ("TOTP_DEVICE_ADDED", ("totp_device_added", "TOTP device added")),
        ("TOTP_DEVICE_REMOVED", ("totp_device_removed", "TOTP device removed")),
        ("LOGIN_LOCKED_OUT", ("login_locked_out", "Login locked out")),
        ("REAUTHENTICATED", ("reauthenticated", "Re-authenticated to approve")),
        # Fair use (gpuadmin/fairuse/): a policy created, changed or deleted (details["change"]), and a
        # step of one of its cases (details["step"]: notified, snoozed, reminded, requested, resolved).
        ("POLICY_CHANGED", ("policy_changed", "Fair-use policy changed")),
        ("FAIR_USE_STEP", ("fair_use_step", "Fair-use step")),
    ],
    module=__name__,
)


def _only_clears_actor(kwargs: dict[str, Any]) -> bool:
    return bool(kwargs) and all(k in ("actor", "actor_id") and v is None for k, v in kwargs.items())


class AuditEventQuerySet(models.QuerySet):
    def verify(self, *, chunk_size: int = VERIFY_CHUNK_SIZE) -> VerifyResult:
        """Recompute the whole chain, streamed from the database in chunks.

        ``AuditEvent.objects.verify()`` (or ``.using(alias).verify()``): a
        filtered queryset would only report the gaps its filter makes, so it
        is refused.
        """
        if self.query.has_filters() or self.query.is_sliced:
            raise ValueError("verify the whole audit log, not a filtered part of it")
        rows = self.order_by("sequence").values_list(*VERIFY_COLUMNS).iterator(chunk_size=chunk_size)
        return check_rows(rows)

    def verify_after(self, sequence: int, hash_hex: str, *, chunk_size: int = VERIFY_CHUNK_SIZE,
                     ) -> VerifyResult:
        """Recompute only the events after a prefix verified earlier: event ``sequence`` with ``hash_hex``.

        The prefix's own rows are not read again, except event ``sequence``,
        whose stored hash must still be ``hash_hex`` (else the log was cut or
        rewritten from there). A change to an earlier event that kept its
        stored hash is left to a full ``verify()`` (``manage.py verify_audit``).
        """
        if self.query.has_filters() or self.query.is_sliced:
            raise ValueError("verify the whole audit log, not a filtered part of it")
        stored = self.filter(sequence=sequence).values_list("hash", flat=True).first()
        if stored != hash_hex:
            what = "is missing" if stored is None else f"has another hash now ({stored[:16]}…)"
            return VerifyResult(
                ok=False, events=self.count(), first_bad_sequence=sequence,
                problem=f"event {sequence}, verified earlier with hash {hash_hex[:16]}…, {what} "
                        "(the log was cut or rewritten from there)",
            )
        rows = (self.filter(sequence__gt=sequence).order_by("sequence").values_list(*VERIFY_COLUMNS)
                .iterator(chunk_size=chunk_size))
        return check_rows(rows, after_sequence=sequence, after_hash=hash_hex)

    def update(self, **kwargs: Any) -> int:
        # Django's deletion collector clears the actor of a deleted user with
        # queryset.update(actor=None); that is the only update we let through.
        if _only_clears_actor(kwargs):
            return super().update(**kwargs)
        raise AppendOnlyError("Audit events are append-only: they cannot be updated.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Audit events are append-only: they cannot be deleted.")

    def bulk_create(self, *args: Any, **kwargs: Any) -> list:
        raise AppendOnlyError("Audit events are written one at a time by gpuadmin.audit.log.record().")

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise AppendOnlyError("Audit events are append-only: they cannot be updated.")

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise AppendOnlyError("Audit events are append-only: they cannot be updated.")


AuditEventManager = models.Manager.from_queryset(AuditEventQuerySet)


class AuditEvent(models.Model):
    sequence = models.PositiveBigIntegerField(unique=True, editable=False)
    created_at = models.DateTimeField(db_index=True, editable=False)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_events",
    )
    # Empty when the system acted (sweeper, agent report) rather than a person.
    actor_name = models.TextField(blank=True)
    action = models.CharField(max_length=32, choices=Action.choices, db_index=True)
    kill_request_id = models.PositiveBigIntegerField(null=True, blank=True, db_index=True)
    host_name = models.TextField(blank=True, db_index=True)
    requester_name = models.TextField(blank=True)
    approver_name = models.TextField(blank=True)
    # Owners of the targets, sorted, comma-separated: "alice,bob".
    process_users = models.TextField(blank=True)
    targets_summary = models.TextField(blank=True)
    # Canonical JSON text, exactly as hashed. Kept as text, not a JSON column,
    # because PostgreSQL's jsonb rewrites numbers (1e16 -> 10000000000000000)
    # and refuses "\u0000", either of which would break the hash on read-back.
    details_json = models.TextField(default="{}")
    previous_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    objects = AuditEventManager()
    # Set by gpuadmin.audit.sentences.described for display (a tuple of its Parts); never stored.
    sentence: tuple[Any, ...]

    class Meta:
        ordering = ["sequence"]
        # The deletion collector reaches events through the base manager; make
        # it the refusing one too.
        base_manager_name = "objects"
        verbose_name = "audit event"

    def __str__(self) -> str:
        return f"#{self.sequence} {self.action}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError(f"Audit event #{self.sequence} is append-only: it cannot be changed.")
        if not self.hash or self.created_at is None or self.hash != self.computed_hash():
            raise AppendOnlyError(
                "Audit events are written by gpuadmin.audit.log.record(), which chains them."
            )
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(f"Audit event #{self.sequence} is append-only: it cannot be deleted.")

    @property
    def details(self) -> Any:
        return json.loads(self.details_json)

    @property
    def details_text(self) -> str:
        """The details for people: readable Unicode instead of the stored \\u escapes."""
        return json.dumps(self.details, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))

    @property
    def process_user_list(self) -> list[str]:
        return [u for u in self.process_users.split(",") if u]

    def hashed_fields(self) -> dict[str, Any]:
        """Every field the hash covers, as stored (``chain.HASHED_FIELDS``, in that order)."""
        return {name: getattr(self, name) for name in HASHED_FIELDS}

    def hashed_field_texts(self) -> list[tuple[str, str]]:
        """The hashed fields as the hash reads them, for people: the time in UTC as hashed, None as null."""
        texts = []
        for name, value in self.hashed_fields().items():
            text = timestamp_text(value) if name == "created_at" else value
            texts.append((name, "null" if text is None else str(text)))
        return texts

    def computed_hash(self) -> str:
        return event_hash(self.hashed_fields())

    @property
    def hash_recomputes(self) -> bool:
        """True when this event's stored hash is the hash of its fields (its links are the chain's job)."""
        try:
            return self.computed_hash() == self.hash
        except (TypeError, ValueError):
            return False
