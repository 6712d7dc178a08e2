"""Helpers of the account tests."""

from __future__ import annotations

from typing import Any

from gpuadmin.audit.models import AuditEvent


def account_events() -> list[tuple[str, str, dict[str, Any]]]:
    """(action, actor name, details) of every audit event, oldest first."""
    return [(e.action, e.actor_name, e.details) for e in AuditEvent.objects.order_by("sequence")]
