"""A change to someone else's credentials holds their approvals for a day, and is announced.

The audit trail's receivers (``audit_trail.py``: model signals, so the admin site, a page and a
shell are all covered) call ``note`` for every change to how an account signs in or what it may
do: its creation, its password, its roles (groups, superuser, staff), its TOTP devices, its API
tokens. When a logged-in person other than the account's holder made it, ``note`` records a
``CredentialChange`` in the change's own transaction and sends ``credentials_changed``
(``gpuadmin.notify`` tells that person and the approvers). For
``models.CREDENTIAL_CHANGE_HOLD_SECONDS`` after it the account may not approve
(``approval_refusal``, asked by the kill services, so the page and the API both refuse).

Changes made by the account's holder, or with no logged-in person (``manage.py`` commands, a
shell: whoever runs them holds the database and central's signing key already), are not held.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.dispatch import Signal
from django.utils import timezone

from gpuadmin.accounts.models import CREDENTIAL_CHANGE_HOLD_SECONDS, CredentialChange
from gpuadmin.text import utc_text

# Sent inside the change's transaction with ``change`` (a CredentialChange), so that what a receiver
# writes commits or rolls back with the change.
credentials_changed = Signal()


def note(user: Any, kind: CredentialChange.Kind, detail: str = "", *, actor: Any) -> CredentialChange | None:
    """Record that ``actor`` changed ``user``'s credentials; None when it is not someone else's doing."""
    if actor is None or not actor.is_authenticated or actor.pk == user.pk:
        return None
    change = CredentialChange.objects.create(
        user=user, changed_by_id=actor.pk, changed_by_name=actor.get_username(), kind=kind,
        detail=detail[:300],
    )
    credentials_changed.send(sender=CredentialChange, change=change)
    return change


def approval_refusal(user: Any, now: datetime | None = None) -> str | None:
    """Why this account may not approve now (someone else changed its credentials lately), or None."""
    change = CredentialChange.objects.holding(user.pk, now or timezone.now()).first()
    if change is None:
        return None
    return (
        f"{change.changed_by_name} {change.done_to('this account')} at "
        f"{utc_text(change.changed_at, timespec='minutes')}; an account whose credentials someone "
        f"else changed cannot approve for {CREDENTIAL_CHANGE_HOLD_SECONDS // 3600} hours after it "
        "(docs/security.md). Another approver must approve."
    )
