"""Fair-use policies, the cases they found, the notices sent about them, and nudges between people.

A ``Policy`` (edited in the admin, every change audited) names a condition, whom it applies to
and its steps' times; in dry-run it only lists what it would have done (``dry_run.py``). A
``Case`` is one thing a live policy found (one process, or one person over the GPU limit), from
first seen until the condition is gone; its status moves only by ``states.TRANSITIONS``.
Policies read the fleet's live state (latest snapshots, GPUs' ``idle_since``, process lives),
never the usage ledger.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpuadmin.fairuse.states import CaseState, NudgeState, check_transition
from gpuadmin.fleet.models import Host
from gpuadmin.kills.models import KillRequest
from gpuadmin.notify.models import Person


class Policy(models.Model):
    class Condition(models.TextChoices):
        IDLE_HOLDER = "idle_holder", "GPU memory held at 0% utilisation for N minutes"
        TOO_MANY_GPUS = "too_many_gpus", "More than K GPUs held by one person"
        ORPHAN_OR_ZOMBIE = "orphan_or_zombie", "GPU memory held by an orphan or a zombie tree for N minutes"

    class Mode(models.TextChoices):
        DRY_RUN = "dry_run", "Dry run: list what it would have done"
        LIVE = "live", "Live: notify, then file kill requests (an approver still decides)"
        OFF = "off", "Off"

    class Scope(models.TextChoices):
        ALL = "all", "Everyone, every host"
        HOSTS = "hosts", "Only the hosts listed"
        PEOPLE = "people", "Only the people listed"

    name = models.CharField(max_length=100, unique=True)
    condition = models.CharField(max_length=20, choices=Condition.choices)
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.DRY_RUN)
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.ALL)
    hosts = models.ManyToManyField(Host, blank=True, related_name="fair_use_policies")
    people = models.ManyToManyField(Person, blank=True, related_name="fair_use_policies")
    minutes = models.PositiveIntegerField(default=60, help_text="N: how long the condition must hold.")
    max_gpus = models.PositiveIntegerField(
        default=4, help_text="K: GPUs one person may hold (too_many_gpus)."
    )
    notify_again_after_minutes = models.PositiveIntegerField(default=30)
    request_after_minutes = models.PositiveIntegerField(
        default=30, help_text="After the second notice: file a kill request (it still needs an approver)."
    )
    snooze_minutes = models.PositiveIntegerField(
        default=120, help_text="One 'still needed' answer snoozes this long."
    )
    max_snooze_minutes = models.PositiveIntegerField(
        default=480, help_text="All snoozes of one case together."
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return f"{self.name} ({self.get_mode_display().split(':')[0].lower()})"

    def get_absolute_url(self) -> str:
        """The policy's page, with its dry run (the admin's "view on site")."""
        from django.urls import reverse

        return reverse("fair_use_policy", args=[self.pk])

    def described(self) -> dict[str, object]:
        """What the audit log keeps of a policy's settings."""
        return {
            "name": self.name,
            "condition": self.condition,
            "mode": self.mode,
            "scope": self.scope,
            "hosts": sorted(h.name for h in self.hosts.all()) if self.pk else [],
            "people": sorted(p.name for p in self.people.all()) if self.pk else [],
            "minutes": self.minutes,
            "max_gpus": self.max_gpus,
            "notify_again_after_minutes": self.notify_again_after_minutes,
            "request_after_minutes": self.request_after_minutes,
            "snooze_minutes": self.snooze_minutes,
            "max_snooze_minutes": self.max_snooze_minutes,
        }


class Case(models.Model):
    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="cases")
    # What it is about: "<host>:<pid>:<start ticks>" for a process, "person:<pk>" for a holder of too many.
    key = models.CharField(max_length=300)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="fair_use_cases")
    person = models.ForeignKey(
        Person, on_delete=models.SET_NULL, null=True, blank=True, related_name="fair_use_cases"
    )
    status = models.CharField(max_length=10, choices=CaseState.choices, default=CaseState.WATCHING)
    summary = models.TextField()
    # [[pid, start_time_ticks], ...]: what a kill request would target.
    targets = models.JSONField(default=list)
    held_bytes = models.BigIntegerField(default=0)
    condition_since = models.DateTimeField()
    first_seen_at = models.DateTimeField()
    notified_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    snoozed_until = models.DateTimeField(null=True, blank=True)
    snoozed_seconds = models.PositiveIntegerField(default=0)
    snooze_reason = models.TextField(blank=True)
    kill_request = models.ForeignKey(
        KillRequest, on_delete=models.SET_NULL, null=True, blank=True, related_name="fair_use_cases"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-first_seen_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["policy", "key"],
                condition=~Q(status=CaseState.RESOLVED),
                name="one_open_case_per_policy_and_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.policy.name}: {self.summary} ({self.status})"

    def transition(self, to: CaseState) -> None:
        """Move to ``to`` or raise InvalidTransition; the caller saves (and audits) in its transaction."""
        check_transition(self.status, to)
        self.status = to

    @property
    def is_open(self) -> bool:
        return self.status != CaseState.RESOLVED


class Nudge(models.Model):
    """One person asking another to release a GPU; a kill request for approvers only if ignored."""

    sender = models.ForeignKey(Person, on_delete=models.CASCADE, related_name="nudges_sent")
    recipient = models.ForeignKey(Person, on_delete=models.CASCADE, related_name="nudges_received")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="nudges")
    pid = models.PositiveIntegerField()
    start_time_ticks = models.BigIntegerField()
    summary = models.TextField()
    message = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=NudgeState.choices, default=NudgeState.OPEN)
    created_at = models.DateTimeField(default=timezone.now)
    escalate_at = models.DateTimeField()
    kill_request = models.ForeignKey(
        KillRequest, on_delete=models.SET_NULL, null=True, blank=True, related_name="nudges"
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["sender", "recipient", "created_at"])]

    def __str__(self) -> str:
        return f"{self.sender.name} → {self.recipient.name}: {self.summary} ({self.status})"


class Notice(models.Model):
    """One message to one person about a case or a nudge (delivered through notify's Apprise sender)."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    case = models.ForeignKey(Case, on_delete=models.CASCADE, null=True, blank=True, related_name="notices")
    nudge = models.ForeignKey(Nudge, on_delete=models.CASCADE, null=True, blank=True, related_name="notices")
    person = models.ForeignKey(Person, on_delete=models.SET_NULL, null=True, related_name="fair_use_notices")
    recipient_name = models.CharField(max_length=200)
    subject = models.CharField(max_length=300)
    body = models.TextField()
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.subject} → {self.recipient_name} ({self.status})"
