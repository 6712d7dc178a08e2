"""Changes someone made to another person's credentials, remembered so the two-person rule can hold.

A superuser can set anyone's password in the admin site, give anyone the approver role, or a
TOTP device or an API token, and then approve their own request as that person. The change is
an audit event (``audit_trail``); it is also a ``CredentialChange`` row, and for
``CREDENTIAL_CHANGE_HOLD_SECONDS`` after it the changed account cannot approve
(``credential_changes.approval_refusal``), while that person and the other approvers are told
(``gpuadmin.notify``). docs/security.md, "Second review (issue 30)".
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

# A day: long enough for the person and the other approvers to read the notice and act on it.
CREDENTIAL_CHANGE_HOLD_SECONDS = 24 * 3600


class CredentialChangeQuerySet(models.QuerySet):
    def holding(self, user_id: int, now: datetime) -> CredentialChangeQuerySet:
        """The changes to this account recent enough that it may not approve, newest first."""
        since = now - timedelta(seconds=CREDENTIAL_CHANGE_HOLD_SECONDS)
        return self.filter(user_id=user_id, changed_at__gt=since).order_by("-changed_at", "-pk")


class CredentialChange(models.Model):
    """Someone (``changed_by``) changed how ``user`` signs in or what it may do."""

    class Kind(models.TextChoices):
        CREATED = "created", "account created"
        PASSWORD = "password", "password"
        ROLES = "roles", "roles"
        TOTP_DEVICE = "totp_device", "TOTP device"
        API_TOKEN = "api_token", "API token"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="credential_changes")
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    # Copied, so the notice and the refusal still name them after the account is deleted.
    changed_by_name = models.CharField(max_length=150)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    detail = models.CharField(max_length=300, blank=True)  # e.g. "added: approver"; never a secret
    changed_at = models.DateTimeField(default=timezone.now)

    objects = CredentialChangeQuerySet.as_manager()

    class Meta:
        ordering = ["changed_at", "pk"]
        indexes = [models.Index(fields=["user", "changed_at"])]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of user #{self.user_id} changed by {self.changed_by_name}"

    def done_to(self, account: str) -> str:
        """What was done, in words: "changed the roles (added: approver) of <account>"."""
        if self.kind == self.Kind.CREATED:
            return f"created {account}"
        detail = f" ({self.detail})" if self.detail else ""
        return f"changed the {self.get_kind_display()}{detail} of {account}"


class DirectoryIdentity(models.Model):
    """This account is a person of the lab's directory (LDAP or OpenID Connect), who signs in there.

    Its roles are the directory's (``accounts.directory.roles``), set at each sign-in and by
    ``manage.py sync_people``; its Unix name and uid (posixAccount's ``uid``/``uidNumber``, or the
    provider's claims) make it the same person on every host (``notify.people_from_directory``).
    A local account (none of these) is never taken over by a directory sign-in of the same name.
    """

    class Source(models.TextChoices):
        LDAP = "ldap", "LDAP"
        OIDC = "oidc", "OpenID Connect"

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="directory_identity")
    source = models.CharField(max_length=8, choices=Source.choices)
    # LDAP: the entry's DN; OpenID Connect: the issuer and the subject ("https://sso.lab sub-123").
    subject = models.CharField(max_length=500)
    unix_name = models.CharField(max_length=256, blank=True)
    unix_uid = models.PositiveIntegerField(null=True, blank=True)
    # When the directory last said what this person's roles are (a sign-in or a sync).
    roles_checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "directory identities"
        constraints = [models.UniqueConstraint(fields=["source", "subject"], name="directory_subject_unique")]

    def __str__(self) -> str:
        return f"{self.get_source_display()} {self.subject}"
