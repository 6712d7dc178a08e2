"""People behind unix and Slurm accounts, what they want to hear about, and every notification sent.

A ``Person`` has an email address, optional Apprise URLs (Slack, Matrix, a webhook...) and
three choices of what to receive. ``Account`` rows say which unix or Slurm user on which host
(or on every host) is that person, so the panel can say who owns uid 1000 on gpu07.
``Notification`` rows are the record of each message to one destination: queued, sending, sent
or failed, shown on the kill request's timeline; a few are about an account instead, whose
credentials someone else changed (``accounts.CredentialChange``). They are not audit events: the hash chain
records what was done to processes, not who was told.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpuadmin.accounts.models import CredentialChange
from gpuadmin.fleet.models import Host
from gpuadmin.kills.models import KillRequest


class Person(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(blank=True)
    notification_urls = models.TextField(
        blank=True,
        help_text="Apprise URLs, one per line (slack://..., matrixs://..., json://host/path); "
        "the email address above needs none.",
    )
    # The panel account of this person, if any: approvers and requesters are reached through it.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="person"
    )
    notify_requests_to_approve = models.BooleanField(
        default=True, help_text="As an approver: a new request waits, and one is about to expire."
    )
    notify_my_requests = models.BooleanField(
        default=True, help_text="As a requester: my request was approved, rejected or finished."
    )
    notify_my_processes = models.BooleanField(
        default=True, help_text="As a process owner: a kill of my process was requested, and how it ended."
    )

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "people"

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>" if self.email else self.name

    def apprise_urls(self) -> list[str]:
        """Every destination of this person: the email (through Django's email backend) and each URL."""
        # Imported here: agents load every app's models, and need not import Apprise.
        from gpuadmin.notify.delivery import email_url

        urls = [email_url(self.email)] if self.email else []
        return urls + [line.strip() for line in self.notification_urls.splitlines() if line.strip()]


class Account(models.Model):
    """A unix or Slurm user (by name, uid or both) that is ``person``, on one host or on all."""

    class Kind(models.TextChoices):
        UNIX = "unix", "Unix user"
        SLURM = "slurm", "Slurm user"

    person = models.ForeignKey(Person, on_delete=models.CASCADE, related_name="accounts")
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.UNIX)
    host = models.ForeignKey(
        Host, on_delete=models.CASCADE, null=True, blank=True, related_name="accounts",
        help_text="Empty: this account is the person on every host.",
    )
    name = models.CharField(max_length=256, blank=True)
    uid = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["kind", "name", "uid"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(name="") | Q(uid__isnull=False), name="account_names_someone"
            ),
        ]
        indexes = [models.Index(fields=["host", "kind"])]

    def __str__(self) -> str:
        uid = f"uid {self.uid}" if self.uid is not None else ""
        who = " ".join(part for part in (self.name, uid) if part)
        return f"{self.get_kind_display()} {who} on {self.host.name if self.host else 'every host'}"

    def clean(self) -> None:
        if not self.name and self.uid is None:
            raise ValidationError("Give the user name, the uid, or both.")


class Notification(models.Model):
    """One message to one destination about a kill request (or a credential change), and what became of it."""

    class Event(models.TextChoices):
        # To approvers.
        WAITING = "waiting", "Waiting for approval"
        EXPIRING = "expiring", "About to expire"
        # To the requester.
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        FINISHED = "finished", "Finished"
        # To the owners of the targeted processes.
        KILL_REQUESTED = "kill_requested", "Kill of their process requested"
        KILL_ENDED = "kill_ended", "Kill of their process ended"
        # To the account's holder and the approvers: someone else changed its credentials.
        CREDENTIALS = "credentials", "Credentials changed by someone else"

    class Role(models.TextChoices):
        APPROVER = "approver", "approver"
        REQUESTER = "requester", "requester"
        PROCESS_OWNER = "owner", "process owner"
        ACCOUNT_HOLDER = "account", "account holder"

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        # Claimed by one delivery task while it calls the service: another task for the same
        # notification (redelivered, or forged on the broker) sends nothing (services.deliver). A worker
        # killed mid-call leaves it so; its task, acknowledged on receipt, was lost with it anyway.
        SENDING = "sending", "Sending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    # Exactly one of the two: what the message is about.
    kill_request = models.ForeignKey(KillRequest, on_delete=models.CASCADE, null=True, blank=True,
                                     related_name="notifications")
    credential_change = models.ForeignKey(CredentialChange, on_delete=models.CASCADE, null=True, blank=True,
                                          related_name="notifications")
    event = models.CharField(max_length=16, choices=Event.choices)
    role = models.CharField(max_length=16, choices=Role.choices)
    person = models.ForeignKey(Person, on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="notifications")
    # Copied, so the timeline stays readable after the person is deleted or edits their URLs.
    recipient_name = models.CharField(max_length=200)
    url = models.TextField()  # where it goes (may hold a token: never shown)
    destination = models.CharField(max_length=300)  # the URL with its secrets masked, for people
    subject = models.CharField(max_length=300)
    body = models.TextField()
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            # A redelivered "plan these" task must not double a message.
            models.UniqueConstraint(
                fields=["kill_request", "event", "role", "url"], name="notification_once"
            ),
            models.UniqueConstraint(
                fields=["credential_change", "role", "url"], name="credential_notification_once"
            ),
            models.CheckConstraint(
                condition=Q(kill_request__isnull=False, credential_change__isnull=True)
                | Q(kill_request__isnull=True, credential_change__isnull=False),
                name="notification_about_one_thing",
            ),
        ]
        indexes = [models.Index(fields=["status", "created_at"])]

    def __str__(self) -> str:
        about = f"#{self.kill_request_id}" if self.kill_request_id else f"change #{self.credential_change_id}"
        return f"{about} {self.event} to {self.recipient_name} ({self.status})"
