"""Whom central believes: each host's key, and the messages that fail it (docs/security.md).

Enrolment works like SSH host keys or Salt's key acceptance:

1. The first signed snapshot of an unknown host name makes that host *awaiting
   acceptance*, with the key's fingerprint; nothing of the snapshot is stored.
   An offer not renewed within ``GPUADMIN_HOST_OFFER_EXPIRY_SECONDS`` expires,
   an approver can clear offers from the panel (``withdraw_offers``), and one
   key offers one host.
2. An approver compares the fingerprint with the one the agent logged and
   accepts it (host page, or ``manage.py accept_host NAME --fingerprint F``).
3. From then on a snapshot or kill report about that host counts only when
   that key signed it. ``manage.py forget_host_key NAME`` lets the host offer a
   new key (a re-installed host).

Everything else is a *rejected message*: it changes nothing, it is counted on
the host it names, opens a "messages rejected" finding there, and is written
to the audit log (at most once a minute per host, so that a flood cannot drown
the log; the count keeps the total). Every acceptance and key change is an
audit event too.

A host's signed "order refused" reports are bounded the same way
(``count_order_refusal``): a host, or whoever replays what it signed, could
otherwise write hundreds of audit events a second.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from gpuadmin.audit import log
from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.fleet.models import Finding, Host, SnapshotRejection, awaiting_acceptance_q
from gpuadmin.fleet.storage.statements import Param, PreparedQuery
from gpuadmin.fleet.summary import refresh_host_summary
from gpuadmin.text import clip
from gpuadmin.wire.signing import Opened, fingerprint, parse_public_key, public_key_text

logger = logging.getLogger(__name__)

# Rejected messages of one host are audited at most this often; the host's count keeps the rest.
REJECTED_AUDIT_INTERVAL = timedelta(minutes=1)
# Anyone on a GPU host can make up host names: past this many, new names are not recorded.
MAX_HOSTS_AWAITING = 100
REASON_MAX_CHARS = 1000
# A host's signed order refusals written to the audit log: at most this many per window; a repeat of
# one written within the repeat window (the same signed text, replayed) is counted, never written.
ORDER_REFUSALS_AUDITED_PER_WINDOW = 10
ORDER_REFUSAL_WINDOW = timedelta(minutes=10)
ORDER_REFUSAL_REPEAT_WINDOW = timedelta(hours=24)


class MessageRejected(Exception):
    """A message that did not come from the host it names; ``reason`` says why."""

    def __init__(self, reason: str, *, host_name: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.host_name = host_name


class KeyMismatch(ValueError):
    """accept_host was given a fingerprint that is not the one the host offered."""


# --- what arrives ---------------------------------------------------------------------


def admit(host_name: str, opened: Opened, *, received_at: datetime) -> Host | None:
    """The host when its accepted key signed this message; None while it awaits acceptance.

    An unknown name (or a host that has no key yet) becomes awaiting
    acceptance with the message's key. Raises MessageRejected when the host
    has another key than the one that signed.
    """
    # No savepoint inside the caller's transaction (ingest): a refusal there fails it all anyway.
    with transaction.atomic(savepoint=False):
        host = _locked_host(host_name)
        if host is None:
            expire_offers(received_at)
            _check_key_offers_no_other_host(host_name, opened)
            if Host.objects.awaiting_acceptance().count() >= MAX_HOSTS_AWAITING:
                raise MessageRejected(
                    f"{MAX_HOSTS_AWAITING} hosts already await acceptance; accept or clear some first",
                    host_name=host_name,
                )
            host = Host.objects.create(name=host_name, first_seen_at=received_at)
        if not host.public_key:
            _check_key_offers_no_other_host(host_name, opened)
            _offer(host, opened, received_at)
            return None
        if host.public_key != opened.public_key:
            state = "accepted" if host.key_accepted else "offered"
            raise MessageRejected(
                f"signed by key {opened.fingerprint}, not by this host's {state} key {host.key_fingerprint}",
                host_name=host_name,
            )
        if not host.key_accepted:
            host.key_offered_at = received_at  # still asking
            host.save(update_fields=["key_offered_at"])
            return None
        return host


# A host row as read whole (its model built from it: Host.from_db); intake.updates locks a batch's.
HOST_COLUMNS = [field.attname for field in Host._meta.concrete_fields]
# Host.objects.select_for_update().get(name=...), compiled once (fleet.storage.statements): every snapshot
# runs it.
_LOCK_HOST = PreparedQuery(
    Host.objects.select_for_update().filter(name=Param(Host, "name")).order_by().values_list(*HOST_COLUMNS)
)


def _locked_host(host_name: str) -> Host | None:
    """The host of this name, its row locked until the transaction ends; None when there is none."""
    rows = _LOCK_HOST.start(name=host_name).rows()
    return Host.from_db(Host.objects.db, HOST_COLUMNS, rows[0]) if rows else None


def _offer(host: Host, opened: Opened, received_at: datetime) -> None:
    host.public_key = opened.public_key
    host.key_fingerprint = opened.fingerprint
    host.key_offered_at = received_at
    host.key_accepted_at = None
    host.key_accepted_by_name = ""
    host.save(update_fields=["public_key", "key_fingerprint", "key_offered_at", "key_accepted_at",
                             "key_accepted_by_name"])
    log.record(Action.HOST_KEY_OFFERED, host_name=host.name, details={"fingerprint": opened.fingerprint})
    logger.warning("host %s offered key %s; it awaits an approver's acceptance", host.name,
                   opened.fingerprint)


def _check_key_offers_no_other_host(host_name: str, opened: Opened) -> None:
    """One key, one host: a key that another host offered or was accepted with offers nothing more.

    Over the broker a message's only source is the key that signed it, and keys cost nothing to
    make: this stops one agent (or root on an enrolled host, with its key) from claiming many names,
    not someone who makes a key per name (expiry and the panel's "clear" are for that).
    """
    other = Host.objects.filter(public_key=opened.public_key).exclude(name=host_name).first()
    if other is not None:
        state = "accepted for" if other.key_accepted else "already offered by"
        raise MessageRejected(f"key {opened.fingerprint} is {state} host {clip(other.name, 100)!r}; one key "
                              "offers one host (forget that host's key first)", host_name=host_name)


def offer_expiry() -> timedelta:
    return timedelta(seconds=settings.GPUADMIN_HOST_OFFER_EXPIRY_SECONDS)


def expire_offers(now: datetime | None = None) -> int:
    """Withdraw the offers not renewed by a snapshot within ``offer_expiry()``; how many.

    Their slots are free again (``MAX_HOSTS_AWAITING``); the host offers again with its next
    snapshot (an agent sends one when it starts).
    """
    now = now or timezone.now()
    stale = Host.objects.awaiting_acceptance().filter(key_offered_at__lt=now - offer_expiry())
    return withdraw_offers(stale, actor_name="central (offer expired)")


def withdraw_offers(hosts: QuerySet[Host], *, actor: Any = None, actor_name: str = "") -> int:
    """Drop the offered, never accepted keys of ``hosts``; how many (each an audit event).

    A host central never stored a snapshot of was only its offer: its row goes. One that has
    history (a re-keyed host) keeps it, without a key, as after ``forget_host_key``.
    """
    withdrawn = 0
    with transaction.atomic(savepoint=False):
        for host in hosts.filter(awaiting_acceptance_q()).select_for_update().order_by("name"):
            details: dict[str, Any] = {"fingerprint": host.key_fingerprint, "was_accepted": False,
                                       "offer_withdrawn": True}
            if actor_name and actor is None:
                details["by"] = actor_name
            if host.last_seen_at is None:
                host.delete()
            else:
                host.public_key = host.key_fingerprint = ""
                host.key_offered_at = None
                host.save(update_fields=["public_key", "key_fingerprint", "key_offered_at"])
            log.record(Action.HOST_KEY_FORGOTTEN, actor=actor, host_name=host.name, details=details)
            withdrawn += 1
    if withdrawn:
        logger.warning("withdrew %d offered host key(s) (%s)", withdrawn,
                       actor_name or (actor.get_username() if actor is not None else "?"))
    return withdrawn


def signed_by_accepted_key(host_name: str, opened: Opened) -> Host:
    """The host, when its accepted key signed; MessageRejected otherwise (kill reports, refusals)."""
    host = Host.objects.filter(name=host_name).first() if host_name else None
    if host is None:
        raise MessageRejected(f"names host {clip(host_name, 100)!r}, which central does not know",
                              host_name=host_name)
    if not host.key_accepted:
        raise MessageRejected("this host's key has not been accepted", host_name=host_name)
    if host.public_key != opened.public_key:
        raise MessageRejected(
            f"signed by key {opened.fingerprint}, not by this host's accepted key {host.key_fingerprint}",
            host_name=host_name,
        )
    return host


def is_accepted_key(host_name: str, opened: Opened) -> bool:
    try:
        signed_by_accepted_key(host_name, opened)
    except MessageRejected:
        return False
    return True


def reject_message(
    kind: SnapshotRejection.MessageKind,
    reason: str,
    *,
    host_name: str = "",
    size_bytes: int = 0,
    received_at: datetime | None = None,
) -> None:
    """Count and show a message that did not come from the host it names; nothing else changes."""
    received_at = received_at or timezone.now()
    reason = clip(reason, REASON_MAX_CHARS)
    logger.warning("rejected a %s naming host %r: %s", kind.label.lower(), host_name or "?", reason)
    with transaction.atomic():
        SnapshotRejection.objects.create(
            host_name=host_name[:253], message_kind=kind, received_at=received_at,
            size_bytes=min(size_bytes, 2**31 - 1), error=f"rejected message: {reason}",
        )
        host = Host.objects.select_for_update().filter(name=host_name).first() if host_name else None
        if host is None:
            return  # an unknown name: the rejection log has it, and names alone create nothing
        host.rejected_message_count += 1
        host.last_rejected_message_at = received_at
        host.last_rejected_message_reason = reason
        host.save(update_fields=["rejected_message_count", "last_rejected_message_at",
                                 "last_rejected_message_reason"])
        _open_rejected_finding(host, kind, reason, received_at)
        recently = AuditEvent.objects.filter(
            action=Action.MESSAGE_REJECTED, host_name=host.name,
            created_at__gte=received_at - REJECTED_AUDIT_INTERVAL,
        ).exists()
        if not recently:
            log.record(Action.MESSAGE_REJECTED, host_name=host.name, details={
                "kind": kind.value, "reason": reason, "rejected_so_far": host.rejected_message_count,
            })


def count_order_refusal(host: Host, opened: Opened, *, received_at: datetime) -> dict[str, Any] | None:
    """Count a signed order refusal on its host; what its audit event adds, or None when it is not written.

    Not written: a repeat of one written within ``ORDER_REFUSAL_REPEAT_WINDOW`` (the same signed text,
    by its SHA-256: a replay off the broker, or the agent's own resend), or one past
    ``ORDER_REFUSALS_AUDITED_PER_WINDOW`` of the host's within ``ORDER_REFUSAL_WINDOW``. The host's
    counts keep them all, and the next one written says how many were not (``not_written_before``).
    Call inside the transaction that writes the event: the host row's lock orders concurrent refusals.
    """
    digest = hashlib.sha256(opened.text.encode()).hexdigest()
    with transaction.atomic(savepoint=False):
        locked = Host.objects.select_for_update().only(
            "pk", "name", "order_refusal_count", "order_refusals_unwritten_count"
        ).get(pk=host.pk)
        locked.order_refusal_count += 1
        refusals = AuditEvent.objects.filter(action=Action.ORDER_REFUSED, host_name=locked.name)
        # The details as log.record writes them (canonical JSON): quotes inside text are escaped,
        # so only the key itself matches.
        repeat = refusals.filter(created_at__gte=received_at - ORDER_REFUSAL_REPEAT_WINDOW,
                                 details_json__contains=f'"report_sha256":"{digest}"').exists()
        over = not repeat and refusals.filter(
            created_at__gte=received_at - ORDER_REFUSAL_WINDOW
        ).count() >= ORDER_REFUSALS_AUDITED_PER_WINDOW
        added: dict[str, Any] | None = None
        if repeat or over:
            locked.order_refusals_unwritten_count += 1
        else:
            added = {"report_sha256": digest, "refusals_so_far": locked.order_refusal_count}
            if locked.order_refusals_unwritten_count:
                added["not_written_before"] = locked.order_refusals_unwritten_count
            locked.order_refusals_unwritten_count = 0
        locked.save(update_fields=["order_refusal_count", "order_refusals_unwritten_count"])
    if added is None:
        logger.info("order refusal from %s not written to the audit log (%s); %d so far", host.name,
                    "a repeat" if repeat else "over the bound", locked.order_refusal_count)
    return added


def _open_rejected_finding(host: Host, kind: SnapshotRejection.MessageKind, reason: str,
                           now: datetime) -> None:
    details: dict[str, Any] = {"count": host.rejected_message_count, "last_kind": kind.value,
                               "last_reason": reason}
    title = (f"{host.rejected_message_count} message(s) naming this host were rejected "
             f"(last: {kind.label.lower()})")
    finding = host.findings.open().filter(kind=Finding.Kind.REJECTED_MESSAGES).first()
    if finding is not None:
        finding.last_seen_at = now
        finding.details = details
        finding.title = clip(title, 300)
        finding.save(update_fields=["last_seen_at", "details", "title"])
        refresh_host_summary(host.pk, now=now)  # its title may be the worst the fleet page names
        return
    Finding.objects.create(
        host=host, kind=Finding.Kind.REJECTED_MESSAGES, key="", severity=Finding.Severity.WARNING,
        title=clip(title, 300),
        remedy=("Something that can write to the broker sent messages for this host that its key did not "
                "sign (forged, altered, or from a re-installed host). Check the audit log; accepting the "
                "host's key again closes this finding."),
        details=details, first_seen_at=now, last_seen_at=now,
    )
    refresh_host_summary(host.pk, now=now)


# --- what approvers do -------------------------------------------------------------------


def accept_host(name: str, *, actor: Any = None, actor_name: str = "", expected_fingerprint: str = "",
                public_key: str = "", ask_for_snapshot: bool = True) -> Host:
    """Trust the key the host offered (or ``public_key``, enrolling a host before it sent anything).

    ``expected_fingerprint`` must match when given: the approver compares the
    fingerprint the agent logged with the one central received. Closes the
    host's "messages rejected" finding, since someone has now looked.
    Raises Host.DoesNotExist, KeyMismatch.
    """
    now = timezone.now()
    with transaction.atomic():
        if public_key:
            public_key = public_key_text(parse_public_key(public_key))  # ValueError when not a key
            host, _ = Host.objects.select_for_update().get_or_create(
                name=name, defaults={"first_seen_at": now}
            )
            if host.public_key and host.public_key != public_key:
                raise KeyMismatch(f"host {name} has key {host.key_fingerprint}; forget it first "
                                  "(manage.py forget_host_key) to enrol another")
            if host.key_accepted:
                return host  # enrolled with this very key already: nothing changes, nothing to log
            host.public_key = public_key
            host.key_fingerprint = fingerprint(public_key)
        else:
            host = Host.objects.select_for_update().get(name=name)
            if not host.public_key:
                raise KeyMismatch(f"host {name} has offered no key yet; start its agent first")
        if expected_fingerprint and expected_fingerprint.strip() != host.key_fingerprint:
            raise KeyMismatch(
                f"host {name} offered key {host.key_fingerprint}, not {expected_fingerprint.strip()}"
            )
        host.key_accepted_at = now
        host.key_accepted_by_name = actor_name or (actor.get_username() if actor is not None else "")
        host.save(update_fields=["public_key", "key_fingerprint", "key_accepted_at", "key_accepted_by_name"])
        if host.findings.open().filter(kind=Finding.Kind.REJECTED_MESSAGES).update(resolved_at=now):
            refresh_host_summary(host.pk, now=now)
        details: dict[str, Any] = {"fingerprint": host.key_fingerprint}
        if actor_name and actor is None:
            details["by"] = actor_name
        log.record(Action.HOST_ACCEPTED, actor=actor, host_name=host.name, details=details)
    if ask_for_snapshot:  # not when the caller sends one next (manage.py demo_fleet has no agent to ask)
        transaction.on_commit(lambda: _probe_soon(host.name), robust=True)
    return host


def _probe_soon(host_name: str) -> None:
    """Ask the new host for a snapshot now rather than at its clock's next probe."""
    from gpuadmin.fleet.probes import probe_now

    try:
        probe_now(host_name)
    except Exception:  # the broker being down must not undo an acceptance
        logger.exception("could not ask %s for a snapshot after its acceptance", host_name)


def forget_host_key(name: str, *, actor: Any = None, actor_name: str = "") -> Host:
    """Drop the host's key: its next signed snapshot offers a key again. Raises Host.DoesNotExist."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(name=name)
        details: dict[str, Any] = {"fingerprint": host.key_fingerprint, "was_accepted": host.key_accepted}
        if actor_name and actor is None:
            details["by"] = actor_name
        host.public_key = ""
        host.key_fingerprint = ""
        host.key_accepted_at = None
        host.key_accepted_by_name = ""
        host.save(update_fields=["public_key", "key_fingerprint", "key_accepted_at", "key_accepted_by_name"])
        log.record(Action.HOST_KEY_FORGOTTEN, actor=actor, host_name=host.name, details=details)
    return host
