"""What each notification says, written once. Pure functions of a kill request, or of a change to
someone's credentials (no sending).

Every message carries the link to the request's page (``GPUADMIN_BASE_URL``). The process
owner's "kill requested" message says what will happen and when: the plan's first signal is
usually SIGINT, the chance to checkpoint, so it names the grace period before the next one.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.urls import reverse

from gpuadmin.accounts.models import CREDENTIAL_CHANGE_HOLD_SECONDS, CredentialChange
from gpuadmin.kills.models import KillRequest, KillTarget
from gpuadmin.text import human_bytes, utc_text

PREFIX = "[gpuadmin]"


def link(kill_request: KillRequest) -> str:
    return settings.GPUADMIN_BASE_URL.rstrip("/") + reverse("kill_request_detail", args=[kill_request.pk])


def _when(moment: datetime) -> str:
    return utc_text(moment, timespec="seconds")


def _what(kill_request: KillRequest) -> str:
    return f"kill request #{kill_request.pk} on {kill_request.host.name}"


def _target_lines(targets: Iterable[KillTarget]) -> str:
    lines = []
    for t in targets:
        owner = f", {t.owner_label}" if t.owner else ""
        memory = f", {human_bytes(t.total_gpu_memory_bytes)} GPU memory" if t.total_gpu_memory_bytes else ""
        outcome = f": {t.get_outcome_display().lower()}" if t.outcome != KillTarget.Outcome.PENDING else ""
        lines.append(f"- PID {t.pid} {t.name} (user {t.user or t.uid}{owner}{memory}){outcome}")
    return "\n".join(lines)


def _plan_lines(kill_request: KillRequest) -> str:
    steps = kill_request.plan
    lines = [f"{i}. {step['signal']}, then up to {step['grace_seconds']} s for the processes to exit"
             for i, step in enumerate(steps, 1)]
    return "\n".join(lines)


def _outcome(kill_request: KillRequest) -> str:
    detail = f": {kill_request.result_detail}" if kill_request.result_detail else ""
    text = f"{kill_request.get_status_display()}{detail}"
    if kill_request.decision_reason:
        text += f"\nReason given: {kill_request.decision_reason}"
    return text


def waiting(kill_request: KillRequest) -> tuple[str, str]:
    return (
        f"{PREFIX} {_what(kill_request).capitalize()} waits for approval",
        f"{kill_request.requested_by_name} asks to stop these processes on {kill_request.host.name}:\n"
        f"{_target_lines(kill_request.targets.all())}\n\n"
        f"Reason: {kill_request.reason}\n\nPlan:\n{_plan_lines(kill_request)}\n\n"
        f"It expires unless approved by {_when(kill_request.pending_expires_at)}.\n"
        f"Approve or reject: {link(kill_request)}",
    )


def expiring(kill_request: KillRequest) -> tuple[str, str]:
    return (
        f"{PREFIX} {_what(kill_request).capitalize()} expires at {_when(kill_request.pending_expires_at)}",
        f"{kill_request.requested_by_name}'s request to stop {kill_request.targets.count()} process(es) on "
        f"{kill_request.host.name} is still waiting, and expires at {_when(kill_request.pending_expires_at)}."
        f"\nReason: {kill_request.reason}\n\nApprove or reject: {link(kill_request)}",
    )


def decided(kill_request: KillRequest) -> tuple[str, str]:
    by = kill_request.approved_by_name or kill_request.closed_by_name
    return (
        f"{PREFIX} Your {_what(kill_request)} was {kill_request.get_status_display().lower()}",
        f"Your request to stop these processes on {kill_request.host.name} was "
        f"{kill_request.get_status_display().lower()} by {by}.\n{_target_lines(kill_request.targets.all())}\n"
        + (f"Reason given: {kill_request.decision_reason}\n" if kill_request.decision_reason else "")
        + f"\n{link(kill_request)}",
    )


def finished(kill_request: KillRequest) -> tuple[str, str]:
    memory = ""
    if kill_request.memory_expected_release_bytes:
        memory = f"\nGPU memory the targets held: {human_bytes(kill_request.memory_expected_release_bytes)}."
    return (
        f"{PREFIX} Your {_what(kill_request)} ended: {kill_request.get_status_display().lower()}",
        f"Outcome: {_outcome(kill_request)}\n{_target_lines(kill_request.targets.all())}{memory}\n\n"
        f"{link(kill_request)}",
    )


def kill_requested(kill_request: KillRequest, targets: list[KillTarget]) -> tuple[str, str]:
    first = kill_request.plan[0] if kill_request.plan else {"signal": "SIGKILL", "grace_seconds": 0}
    checkpoint = (
        f"If it is approved, your processes first get {first['signal']} and then "
        f"{first['grace_seconds']} s to exit: save your work (a checkpoint) now, or when that signal "
        "arrives."
        if first["signal"] != "SIGKILL" else "The plan starts with SIGKILL: save your work now."
    )
    return (
        f"{PREFIX} A kill of your processes on {kill_request.host.name} was requested",
        f"{kill_request.requested_by_name} asked to stop these processes of yours on "
        f"{kill_request.host.name} ({_what(kill_request)}):\n{_target_lines(targets)}\n\n"
        f"Reason: {kill_request.reason}\n\nPlan:\n{_plan_lines(kill_request)}\n\n{checkpoint}\n"
        f"An approver must confirm it first; it expires unapproved at "
        f"{_when(kill_request.pending_expires_at)}.\n{link(kill_request)}",
    )


def kill_ended(kill_request: KillRequest, targets: list[KillTarget]) -> tuple[str, str]:
    return (
        f"{PREFIX} The kill request for your processes on {kill_request.host.name} ended: "
        f"{kill_request.get_status_display().lower()}",
        f"{_what(kill_request).capitalize()} ended.\nOutcome: {_outcome(kill_request)}\n"
        f"Your processes:\n{_target_lines(targets)}\n\n{link(kill_request)}",
    )


def credentials_changed(change: CredentialChange, *, to_holder: bool) -> tuple[str, str]:
    """To the account's holder (``to_holder``) or to the approvers: someone else changed its credentials."""
    name = change.user.get_username()
    hours = CREDENTIAL_CHANGE_HOLD_SECONDS // 3600
    whose = "your account" if to_holder else f"the account {name}"
    check = ("If you did not ask for this, tell the other approvers now: someone may be about to approve "
             "as you." if to_holder else
             f"If {name} did not ask for this, someone may be about to approve as {name}: check with them.")
    return (
        f"{PREFIX} {change.changed_by_name} {change.done_to(whose)}",
        f"{change.changed_by_name} {change.done_to(whose)} at {_when(change.changed_at)}.\n"
        f"For {hours} hours after a change to its credentials by someone else, {name} cannot approve "
        f"kill requests.\n{check}\n"
        f"Audit log: {settings.GPUADMIN_BASE_URL.rstrip('/')}{reverse('audit_log')}",
    )
