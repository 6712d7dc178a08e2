"""Fair use, warning first: evaluate live policies, notify, snooze, notify again, then file a kill
request in the policy's name, which still waits for an approver like any other (never a kill
without approval: the request goes through ``gpuadmin.kills.services``).

Every step of a case and every change to a policy is an audit event (``policy_changed``,
``fair_use_step``) written in the transaction that makes it. The beat task
(``tasks.evaluate_policies``) calls ``evaluate`` once a minute; tests call it with their own clock.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify

from gpuadmin.accounts.roles import Role
from gpuadmin.audit import log
from gpuadmin.audit.models import Action
from gpuadmin.fairuse import conditions
from gpuadmin.fairuse.models import Case, Notice, Nudge, Policy
from gpuadmin.fairuse.people import person_of
from gpuadmin.fairuse.states import OPEN, SNOOZABLE, CaseState, NudgeState
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.fleet.process_tree import process_rows
from gpuadmin.kills import services as kills
from gpuadmin.notify.delivery import send
from gpuadmin.notify.directory import Directory

logger = logging.getLogger(__name__)


class NotAllowed(Exception):
    """The answer is refused; the message says why."""


# --- the audit log ---------------------------------------------------------------------------


def audit_policy(policy: Policy, change: str, actor: Any = None) -> None:
    """A policy created, changed or deleted (the admin calls it in the change's transaction)."""
    log.record(Action.POLICY_CHANGED, actor=actor, details={"change": change, "policy": policy.described()})


def _audit_step(case: Case, step: str, *, actor: Any = None, **details: Any) -> None:
    log.record(
        Action.FAIR_USE_STEP,
        actor=actor,
        host_name=case.host.name,
        kill_request_id=case.kill_request_id,
        process_users=[case.person.name] if case.person else [],
        details={
            "policy": case.policy.name,
            "case": case.pk,
            "step": step,
            "summary": case.summary,
            "targets": case.targets,
            **details,
        },
    )


# --- the policy's identity -----------------------------------------------------------------


def policy_user(policy: Policy) -> Any:
    """The account a policy files its kill requests as: a requester nobody can sign in as.

    Its name says which policy filed (the audit log's actor and the request's "requested by"); it
    is never an approver, and an approver is always someone else, so the two-person rule holds.
    """
    return _system_requester(f"policy-{slugify(policy.name)}"[:150] or f"policy-{policy.pk}")


def _system_requester(username: str) -> Any:
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_unusable_password()
        user.save()
        group, _ = Group.objects.get_or_create(name=Role.REQUESTER)
        user.groups.add(group)
    return user


# --- notices ---------------------------------------------------------------------------------


def _url(path: str) -> str:
    return f"{settings.GPUADMIN_BASE_URL.rstrip('/')}{path}"


def _notify(case: Case, *, again: bool) -> None:
    person = case.person
    if person is None:
        return  # nobody mapped: the case goes on; the host page shows the process
    first = "" if not again else "Second notice: "
    request_in = (
        case.policy.request_after_minutes
        if again
        else (case.policy.notify_again_after_minutes + case.policy.request_after_minutes)
    )
    notice = Notice.objects.create(
        case=case,
        person=person,
        recipient_name=person.name,
        subject=f"[gpuadmin] {first}{case.summary}"[:300],
        body=(
            f"{case.summary}.\nPolicy: {case.policy.name} ({case.policy.get_condition_display()}).\n"
            f"What you hold: {_url(reverse('my_gpus'))}\n"
            f"Still needed? Say why, and it is snoozed: {_url(reverse('fair_use_case', args=[case.pk]))}\n"
            f"Otherwise a kill request is filed in about {request_in} minutes; an approver decides on it."
        ),
    )
    transaction.on_commit(partial(_send_later, notice.pk))


def _send_later(notice_id: int) -> None:
    from gpuadmin.celery import send_central
    from gpuadmin.wire.task_names import DELIVER_FAIR_USE_NOTICE

    send_central(DELIVER_FAIR_USE_NOTICE, notice_id)


def deliver_notice(notice_id: int) -> bool:
    """Send one queued notice to each of its person's destinations; True when every one took it."""
    claimed = Notice.objects.filter(pk=notice_id, status=Notice.Status.QUEUED).update(
        status=Notice.Status.SENT
    )
    if not claimed:
        return True  # sent already, or never queued: a repeated or forged task sends nothing
    notice = Notice.objects.select_related("person").get(pk=notice_id)
    person = notice.person
    errors = []
    for url in person.apprise_urls() if person else []:
        outcome = send(url, notice.subject, notice.body)
        if not outcome.ok:
            errors.append(outcome.error)
    if errors:
        Notice.objects.filter(pk=notice_id).update(status=Notice.Status.FAILED, last_error="; ".join(errors))
    return not errors


# --- evaluation --------------------------------------------------------------------------------


def evaluate(now: datetime | None = None) -> int:
    """Run every live policy once against the fleet's newest snapshots; the number of steps taken."""
    now = now or timezone.now()
    steps = escalate_ignored_nudges(now)
    for policy in Policy.objects.filter(mode=Policy.Mode.LIVE):
        steps += evaluate_policy(policy, now)
    return steps


def evaluate_policy(policy: Policy, now: datetime) -> int:
    in_view = conditions.hosts_in_view(policy, now)
    candidates = {c.key: c for c in conditions.find(policy, now, hosts=in_view)}
    online = {host.pk for host in in_view}
    steps = 0
    open_cases = list(Case.objects.filter(policy=policy, status__in=OPEN)
                      .select_related("host", "person", "policy"))
    # A case on a host gone offline waits: its snapshot is stale, it is neither resolved nor advanced.
    for case in open_cases:
        if case.host_id in online and case.key not in candidates:
            with transaction.atomic():
                case.transition(CaseState.RESOLVED)
                case.resolved_at = now
                case.save()
                _audit_step(case, "resolved", why="the condition no longer holds")
            steps += 1
    seen = {case.key: case for case in open_cases}
    for key, candidate in candidates.items():
        known = seen.get(key)
        if known is not None and _due_step(known, now) is None and _figures(known) == _figures(candidate):
            continue  # most cases, most minutes: nothing to take or write (else re-read under its lock)
        with transaction.atomic():
            found = (
                Case.objects.select_for_update(of=("self",))
                .select_related("host", "person", "policy")
                .filter(policy=policy, key=key, status__in=OPEN)
                .first()
            )
            if found is None:
                case = Case.objects.create(
                    policy=policy,
                    key=key,
                    host=candidate.host,
                    person=candidate.person,
                    summary=candidate.summary,
                    targets=candidate.targets,
                    held_bytes=candidate.held_bytes,
                    condition_since=candidate.since or now,
                    first_seen_at=now,
                )
            else:
                case = found
                case.summary, case.targets, case.held_bytes = _figures(candidate)
            steps += _advance(case, now)
            case.save()
    return steps


def _figures(item: Case | conditions.Candidate) -> tuple[str, list[list[int]], int]:
    """What a case keeps of its candidate's latest reading."""
    return item.summary, item.targets, item.held_bytes


def _due_step(case: Case, now: datetime) -> str | None:
    """The step due on an open case now ("notify", "remind", "request"), or None: at most one a minute."""
    policy = case.policy
    if case.status == CaseState.WATCHING:
        return "notify" if now - case.condition_since >= timedelta(minutes=policy.minutes) else None
    if (
        case.status == CaseState.NOTIFIED
        and case.notified_at is not None
        and now - case.notified_at >= timedelta(minutes=policy.notify_again_after_minutes)
    ) or (case.status == CaseState.SNOOZED and case.snoozed_until is not None and now >= case.snoozed_until):
        return "remind"
    if (
        case.status == CaseState.REMINDED
        and case.reminded_at is not None
        and now - case.reminded_at >= timedelta(minutes=policy.request_after_minutes)
    ):
        return "request"
    return None


def _advance(case: Case, now: datetime) -> int:
    """Take the step that is due (``_due_step``), in the caller's transaction; the steps taken."""
    step = _due_step(case, now)
    if step == "notify":
        case.transition(CaseState.NOTIFIED)
        case.notified_at = now
        _notify(case, again=False)
        _audit_step(case, "notified", person=case.person.name if case.person else None)
        return 1
    if step == "remind":
        case.transition(CaseState.REMINDED)
        case.reminded_at = now
        _notify(case, again=True)
        _audit_step(case, "reminded", person=case.person.name if case.person else None)
        return 1
    if step == "request":
        return _file_request(case, now)
    return 0


def _file_request(case: Case, now: datetime) -> int:
    (pid, start), *also = case.targets
    reason = (
        f"fair-use policy {case.policy.name!r}: {case.summary}; the owner was notified twice "
        "and did not answer"
    )
    try:
        kill_request = kills.file_request(
            policy_user(case.policy),
            host=case.host,
            pid=pid,
            start_time_ticks=start,
            also=[tuple(t) for t in also],
            reason=reason,
            now=now,
        )
    except kills.Conflict as conflict:
        # Someone already asked: the case follows that request instead of filing a second.
        kill_request_id = conflict.extra.get("kill_request_id")
        if kill_request_id is None:
            raise
        kill_request = kills.get_request(kill_request_id)
    except kills.KillError as error:
        logger.warning("fair-use case %s: no kill request filed: %s", case.pk, error)
        return 0
    case.transition(CaseState.REQUESTED)
    case.kill_request = kill_request
    _audit_step(case, "requested", kill_request=kill_request.pk)
    return 1


# --- the owner's answer ------------------------------------------------------------------------


def snooze(case_id: int, user: Any, reason: str, *, now: datetime | None = None) -> Case:
    """The owner says "still needed", with a reason: no step until the snooze ends (bounded)."""
    reason = (reason or "").strip()
    if not reason:
        raise NotAllowed("say why it is still needed: the reason is kept in the audit log")
    now = now or timezone.now()
    with transaction.atomic():
        case = (Case.objects.select_for_update(of=("self",)).select_related("policy", "person", "host")
                .get(pk=case_id))
        person = person_of(user)
        if person is None or case.person_id != person.pk:
            raise NotAllowed("only the person who holds it can say it is still needed")
        if case.status not in SNOOZABLE:
            raise NotAllowed(f"this case is {case.get_status_display().lower()}; it cannot be snoozed now")
        left = case.policy.max_snooze_minutes * 60 - case.snoozed_seconds
        if left <= 0:
            raise NotAllowed(
                f"snoozed for the policy's {case.policy.max_snooze_minutes} minutes already: "
                "free it, or ask an admin to change the policy"
            )
        seconds = min(case.policy.snooze_minutes * 60, left)
        case.transition(CaseState.SNOOZED)
        case.snoozed_until = now + timedelta(seconds=seconds)
        case.snoozed_seconds += seconds
        case.snooze_reason = reason
        case.save()
        _audit_step(
            case,
            "snoozed",
            actor=user,
            reason=reason,
            until=case.snoozed_until.isoformat(),
            snoozed_seconds=case.snoozed_seconds,
        )
    return case


# --- nudges: one person asks another to release a GPU --------------------------------------------


def _holder(host: Host, pid: int, start_time_ticks: int) -> Any:
    document = LatestSnapshot.objects.document_for(host)
    row = process_rows(document).get(pid) if document is not None else None
    if row is None or row.start_time_ticks != start_time_ticks or row.total_gpu_memory_bytes <= 0:
        return None
    return row


def nudge(user: Any, *, host: Host | str, pid: int, start_time_ticks: int, message: str = "",
          now: datetime | None = None) -> Nudge:
    """Ask the person behind a GPU process to release it; at most one nudge per pair of people per
    ``GPUADMIN_NUDGE_INTERVAL_SECONDS``. Ignored past ``GPUADMIN_NUDGE_ESCALATE_MINUTES``, it becomes a
    kill request, which approvers decide on (``escalate_ignored_nudges``)."""
    now = now or timezone.now()
    sender = person_of(user)
    if sender is None:
        raise NotAllowed("your panel account is not linked to a person: ask an admin to link it")
    if isinstance(host, str):
        host = Host.objects.fleet().filter(name=host).first() or Host()
        if host.pk is None:
            raise NotAllowed("no such host")
    row = _holder(host, pid, start_time_ticks)
    if row is None:
        raise NotAllowed(f"PID {pid} holds no GPU memory on {host.name} in its newest snapshot")
    recipient = Directory.for_host(host).person_for(uid=row.uid, user=row.user, owner=row.owner)
    if recipient is None:
        raise NotAllowed(f"nobody in the directory is PID {pid}'s owner on {host.name}: ask an admin instead")
    if recipient.pk == sender.pk:
        raise NotAllowed("it is yours: stop it from My GPUs")
    with transaction.atomic():
        since = now - timedelta(seconds=settings.GPUADMIN_NUDGE_INTERVAL_SECONDS)
        if Nudge.objects.select_for_update().filter(sender=sender, recipient=recipient,
                                                    created_at__gt=since).exists():
            raise NotAllowed(f"you nudged {recipient.name} less than "
                             f"{settings.GPUADMIN_NUDGE_INTERVAL_SECONDS // 60} minutes ago")
        from gpuadmin.fleet.findings.rules import describe

        sent = Nudge.objects.create(
            sender=sender, recipient=recipient, host=host, pid=pid, start_time_ticks=start_time_ticks,
            summary=f"{describe(row)} on {host.name}", message=(message or "").strip()[:2000], created_at=now,
            escalate_at=now + timedelta(minutes=settings.GPUADMIN_NUDGE_ESCALATE_MINUTES),
        )
        notice = Notice.objects.create(
            nudge=sent, person=recipient, recipient_name=recipient.name,
            subject=f"[gpuadmin] {sender.name} asks you to release a GPU on {host.name}"[:300],
            body=(f"{sender.name} asks you to release {sent.summary}."
                  + (f"\nTheir note: {sent.message}" if sent.message else "")
                  + f"\nWhat you hold: {_url(reverse('my_gpus'))}\nIf it still holds the GPU in "
                  f"{settings.GPUADMIN_NUDGE_ESCALATE_MINUTES} minutes, a kill request goes to the "
                  "approvers."),
        )
        log.record(Action.FAIR_USE_STEP, actor=user, host_name=host.name, process_users=[recipient.name],
                   details={"policy": "nudge", "step": "nudged", "summary": sent.summary, "nudge": sent.pk,
                            "from": sender.name, "to": recipient.name, "reason": sent.message})
        transaction.on_commit(partial(_send_later, notice.pk))
    return sent


def escalate_ignored_nudges(now: datetime) -> int:
    """Nudges past their time: released when the process is gone, else a kill request for approvers."""
    steps = 0
    for pending in Nudge.objects.filter(status=NudgeState.OPEN, escalate_at__lte=now).select_related(
            "host", "sender", "recipient"):
        if not Host.objects.online(now).filter(pk=pending.host_id).exists():
            continue  # its newest snapshot is stale: wait for the host
        with transaction.atomic():
            if _holder(pending.host, pending.pid, pending.start_time_ticks) is None:
                pending.status = NudgeState.RELEASED
                pending.save(update_fields=["status"])
                continue
            try:
                kill_request = kills.file_request(
                    _system_requester("nudges"), host=pending.host, pid=pending.pid,
                    start_time_ticks=pending.start_time_ticks, now=now,
                    reason=f"{pending.sender.name} asked {pending.recipient.name} to release it "
                    f"{settings.GPUADMIN_NUDGE_ESCALATE_MINUTES} minutes ago; it still holds the GPU",
                )
            except kills.KillError as error:
                logger.warning("nudge %s: no kill request filed: %s", pending.pk, error)
                continue
            pending.status = NudgeState.ESCALATED
            pending.kill_request = kill_request
            pending.save(update_fields=["status", "kill_request"])
            log.record(Action.FAIR_USE_STEP, host_name=pending.host.name, kill_request_id=kill_request.pk,
                       process_users=[pending.recipient.name],
                       details={"policy": "nudge", "step": "requested", "summary": pending.summary,
                                "nudge": pending.pk})
            steps += 1
    return steps
