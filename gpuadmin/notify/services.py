"""Who is told what about a kill request (or a credential change), and the delivery of each message.

Two steps, each run by a central Celery task (``tasks.py``), never by a web request:

1. ``plan_for_event`` (after a kill request's audit event) and ``plan_expiry_warnings`` (from
   beat) decide the recipients and write one queued ``Notification`` per destination. A
   redelivered task adds nothing (one row per request, event, role and URL).
2. ``deliver`` sends one queued notification through Apprise and records the result: sent,
   or the error and, on the last attempt, failed. A failure touches nothing but its own row.

A change to someone else's credentials (``accounts.credential_changes``) is planned otherwise: by
``plan_for_credential_change``, in the change's own transaction (a few rows, no network), so its
notices exist whenever the change does; only their delivery is a task.

The tasks' arguments come off the broker, which anyone on a GPU host can write to
(docs/security.md): they only name a request, an event or a notification. What is said, to whom,
and whether it is sent again follows from the database: the audit log, the request's status and
the notification's row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from gpuadmin.accounts.models import CredentialChange
from gpuadmin.accounts.roles import Role
from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.kills.models import KillRequest, KillTarget
from gpuadmin.kills.states import RESULTS, TRANSITIONS, Status
from gpuadmin.notify import messages
from gpuadmin.notify.delivery import send, shown_url
from gpuadmin.notify.directory import Directory
from gpuadmin.notify.models import Notification, Person

logger = logging.getLogger(__name__)

Event = Notification.Event
RoleOf = Notification.Role


def _and_after(statuses: Iterable[Status]) -> frozenset[Status]:
    """``statuses`` and every status a request can go on to (``states.TRANSITIONS``)."""
    found, unseen = set(statuses), list(statuses)
    while unseen:
        for following in TRANSITIONS[unseen.pop()] - found:
            found.add(following)
            unseen.append(following)
    return frozenset(found)


# The audit actions that someone hears about (every other one, each signal step..., is silent), each
# with the statuses in which its notices are true: "waits for approval" only while pending, "approved"
# from then on, an ending only in the status it set.
NOTICE_STATUSES: dict[str, frozenset[Status]] = {
    Action.REQUESTED: frozenset({Status.PENDING}),
    Action.APPROVED: _and_after({Status.APPROVED}),
    Action.REJECTED: frozenset({Status.REJECTED}),
    Action.CANCELLED: frozenset({Status.CANCELLED}),
    Action.EXPIRED: frozenset({Status.EXPIRED}),
    Action.FINISHED: RESULTS,
}
NOTIFYING_ACTIONS = frozenset(NOTICE_STATUSES)


class DeliveryFailed(Exception):
    """A delivery attempt failed and another one is due (the task retries); ``attempts`` made so far."""

    def __init__(self, error: str, *, attempts: int) -> None:
        super().__init__(error)
        self.attempts = attempts


def _draft(kill_request: KillRequest | None, event: str, role: str, person: Person,
           text: tuple[str, str], *, credential_change: CredentialChange | None = None) -> list[Notification]:
    subject, body = text
    return [
        Notification(
            kill_request=kill_request, credential_change=credential_change, event=event, role=role,
            person=person, recipient_name=person.name, url=url, destination=shown_url(url),
            subject=subject[:300], body=body,
        )
        for url in person.apprise_urls()
    ]


def approver_users() -> QuerySet:
    """Active accounts that may approve and are someone's account in the directory."""
    return get_user_model().objects.filter(
        Q(is_superuser=True) | Q(groups__name=Role.APPROVER), is_active=True, person__isnull=False,
    )


def _approvers(kill_request: KillRequest) -> list[Person]:
    """People who may approve it and want to hear about requests (not its requester)."""
    users = approver_users().filter(person__notify_requests_to_approve=True)
    if kill_request.requested_by_id and not settings.GPUADMIN_ALLOW_SELF_APPROVAL:
        users = users.exclude(pk=kill_request.requested_by_id)
    return list(Person.objects.filter(user__in=users).distinct())


def _requester(kill_request: KillRequest) -> Person | None:
    person = Person.objects.filter(user_id=kill_request.requested_by_id).first() \
        if kill_request.requested_by_id else None
    return person if person is not None and person.notify_my_requests else None


def _owners(kill_request: KillRequest) -> list[tuple[Person, list[KillTarget]]]:
    """The people whose processes are targets, each with their targets (not the requester)."""
    targets = list(kill_request.targets.all())
    directory = Directory.for_host(kill_request.host)
    by_pk = {a.person.pk: a.person for a in directory.accounts}
    found = []
    for person_pk, theirs in directory.people_for(targets).items():
        person = by_pk[person_pk]
        is_requester = person.user_id is not None and person.user_id == kill_request.requested_by_id
        if not person.notify_my_processes or is_requester:
            continue  # a requester stopping their own processes knows
        found.append((person, theirs))
    return found


def _drafts_for(kill_request: KillRequest, action: str) -> list[Notification]:
    drafts: list[Notification] = []
    owners_event: str | None = None
    owner_text: Callable[[KillRequest, list[KillTarget]], tuple[str, str]] | None = None
    requester = _requester(kill_request)
    if action == Action.REQUESTED:
        for person in _approvers(kill_request):
            drafts += _draft(kill_request, Event.WAITING, RoleOf.APPROVER, person,
                             messages.waiting(kill_request))
        owners_event, owner_text = Event.KILL_REQUESTED, messages.kill_requested
    elif action == Action.APPROVED:
        if requester:
            drafts += _draft(kill_request, Event.APPROVED, RoleOf.REQUESTER, requester,
                             messages.decided(kill_request))
    elif kill_request.is_final:
        # Rejected, cancelled (by someone else), expired, or the agent's (or sweeper's) "finished".
        cancelled_by_requester = (
            kill_request.status == Status.CANCELLED
            and kill_request.closed_by_id == kill_request.requested_by_id
        )
        if requester and not cancelled_by_requester:
            if kill_request.status == Status.REJECTED:
                drafts += _draft(kill_request, Event.REJECTED, RoleOf.REQUESTER, requester,
                                 messages.decided(kill_request))
            else:
                drafts += _draft(kill_request, Event.FINISHED, RoleOf.REQUESTER, requester,
                                 messages.finished(kill_request))
        owners_event, owner_text = Event.KILL_ENDED, messages.kill_ended
    if owners_event and owner_text:
        for person, theirs in _owners(kill_request):
            drafts += _draft(kill_request, owners_event, RoleOf.PROCESS_OWNER, person,
                             owner_text(kill_request, theirs))
    return drafts


def _store(drafts: Iterable[Notification]) -> list[int]:
    """Write the drafts (once: a repeat adds nothing) and return the queued ones' ids."""
    drafts = list(drafts)
    if not drafts:
        return []
    Notification.objects.bulk_create(drafts, ignore_conflicts=True)
    keys = Q()
    for d in drafts:
        about = Q(kill_request=d.kill_request) if d.kill_request else Q(credential_change=d.credential_change)
        keys |= about & Q(event=d.event, role=d.role, url=d.url)
    return list(Notification.objects.filter(keys, status=Notification.Status.QUEUED, attempts=0)
                .values_list("pk", flat=True))


def plan_for_event(kill_request_id: int, action: str) -> list[int]:
    """The notifications a kill request's audit event calls for, stored queued; their ids.

    Drafted only when the request's audit log holds an ``action`` event and the request's status is
    one in which its notices are true. A task that names an event that did not happen (forged on the
    broker) or that no longer holds drafts nothing: it must not take the once-only place
    (``notification_once``) of the real notice, which would then be dropped.
    """
    statuses = NOTICE_STATUSES.get(action)
    if statuses is None:
        return []
    kill_request = (KillRequest.objects.select_related("host").prefetch_related("targets")
                    .filter(pk=kill_request_id).first())
    if kill_request is None:
        return []
    if kill_request.status not in statuses or not _logged(kill_request, action):
        logger.warning("notify: %r of kill request #%s (now %s) is not borne out by its audit log and "
                       "status; nothing drafted (a forged or stale task)",
                       action, kill_request.pk, kill_request.status)
        return []
    return _store(_drafts_for(kill_request, action))


def _logged(kill_request: KillRequest, action: str) -> bool:
    """Whether the audit log, the record, holds an ``action`` event of the request."""
    return AuditEvent.objects.filter(kill_request_id=kill_request.pk, action=action).exists()


def plan_expiry_warnings(now: datetime | None = None) -> list[int]:
    """Warn approvers of pending requests that expire within GPUADMIN_NOTIFY_EXPIRY_WARNING_SECONDS.

    Once per request: a request that already has its warnings is skipped.
    """
    now = now or timezone.now()
    soon = now + timedelta(seconds=settings.GPUADMIN_NOTIFY_EXPIRY_WARNING_SECONDS)
    expiring = (KillRequest.objects.filter(status=Status.PENDING, pending_expires_at__gt=now,
                                           pending_expires_at__lte=soon)
                .exclude(notifications__event=Event.EXPIRING)
                .select_related("host").prefetch_related("targets"))
    ids: list[int] = []
    for kill_request in expiring:
        ids += _store(
            n for person in _approvers(kill_request)
            for n in _draft(kill_request, Event.EXPIRING, RoleOf.APPROVER, person,
                            messages.expiring(kill_request))
        )
    return ids


def plan_for_credential_change(change: CredentialChange) -> list[int]:
    """The notices of a change to someone's credentials by someone else, stored queued; their ids.

    To the account's holder and to every other approver (not the one who made the change), whatever
    they chose to hear about: a security notice is not a preference.
    """
    holder = Person.objects.filter(user_id=change.user_id).first()
    drafts: list[Notification] = []
    if holder is not None:
        drafts += _draft(None, Event.CREDENTIALS, RoleOf.ACCOUNT_HOLDER, holder,
                         messages.credentials_changed(change, to_holder=True), credential_change=change)
    others = approver_users().exclude(pk__in=[change.user_id, change.changed_by_id or 0])
    for person in Person.objects.filter(user__in=others).distinct():
        drafts += _draft(None, Event.CREDENTIALS, RoleOf.APPROVER, person,
                         messages.credentials_changed(change, to_holder=False), credential_change=change)
    return _store(drafts)


def deliver(notification_id: int, *, now: datetime | None = None) -> bool:
    """Send one queued notification; True when sent, or when it is not this call's to send.

    The row decides, not the task's message: it is claimed (``_claim``), so a notification is sent
    once however many tasks name it, and its attempts say which is the last (the first and
    GPUADMIN_NOTIFY_RETRIES more). A failure is recorded (attempts, the error); on the last attempt
    the notification is failed, before that ``DeliveryFailed`` asks the caller to try again later.
    """
    notification = _claim(notification_id)
    if notification is None:
        return True
    # The network call is outside any transaction: a slow service holds no lock.
    outcome = send(notification.url, notification.subject, notification.body)
    now = now or timezone.now()
    last_attempt = notification.attempts > settings.GPUADMIN_NOTIFY_RETRIES
    update: dict[str, object]
    if outcome.ok:
        update = {"status": Notification.Status.SENT, "finished_at": now, "last_error": ""}
    elif last_attempt:
        update = {"status": Notification.Status.FAILED, "finished_at": now, "last_error": outcome.error}
    else:
        update = {"status": Notification.Status.QUEUED, "last_error": outcome.error}
    Notification.objects.filter(pk=notification_id, status=Notification.Status.SENDING).update(**update)
    if outcome.ok:
        return True
    logger.warning("notification %s to %s failed (attempt %s): %s", notification_id,
                   notification.destination, notification.attempts, outcome.error)
    if not last_attempt:
        raise DeliveryFailed(outcome.error, attempts=notification.attempts)
    return False


def _claim(notification_id: int) -> Notification | None:
    """The queued notification, now sending with one more attempt counted; None when it is not queued."""
    # One conditional UPDATE: of two tasks for one notification at once (a redelivered or a forged
    # one), only one changes the row, and only that one sends.
    claimed = Notification.objects.filter(pk=notification_id, status=Notification.Status.QUEUED).update(
        status=Notification.Status.SENDING, attempts=F("attempts") + 1,
    )
    return Notification.objects.get(pk=notification_id) if claimed else None
