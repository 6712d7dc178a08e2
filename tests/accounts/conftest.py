from __future__ import annotations

from typing import Any

from gpuadmin.audit.models import AuditEvent
from tests.kills.conftest import _lab_protections, lab, sent  # noqa: F401 - fixtures (tests of approving)
from tests.people import _fast_password_hashing  # noqa: F401 - autouse fixture


def account_events() -> list[tuple[str, str, dict[str, Any]]]:
    """(action, actor name, details) of every audit event, oldest first."""
    return [(e.action, e.actor_name, e.details) for e in AuditEvent.objects.order_by("sequence")]
