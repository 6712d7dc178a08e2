"""Two approvers click at the same moment: exactly one approval wins (row lock, PostgreSQL)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from gpuadmin.audit.models import AuditEvent
from gpuadmin.kills import changes, services
from gpuadmin.kills.services import decisions
from gpuadmin.kills.states import Status
from tests.kills.helpers import file, refreshed

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


@pytest.mark.usefixtures("lab")
def test_two_concurrent_approvals_one_wins(requester, approver, second_approver, sent, monkeypatch):
    kill_request = file(requester, 4600)
    slow_compare = changes.compare

    def compare_slowly(*args, **kwargs):
        # Hold the decision open (after the status check, before the write) long
        # enough that the other approver is surely inside approve() too.
        time.sleep(0.5)
        return slow_compare(*args, **kwargs)

    monkeypatch.setattr(decisions.changes, "compare", compare_slowly)
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def approve_as(user) -> None:
        try:
            barrier.wait()
            services.approve(kill_request.pk, user)
            outcomes[user.username] = "approved"
        except services.Conflict as conflict:
            outcomes[user.username] = conflict.message
        finally:
            connection.close()

    threads = [threading.Thread(target=approve_as, args=(u,)) for u in (approver, second_approver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(outcomes.values(), key=lambda o: o != "approved")[0] == "approved"
    losers = [o for o in outcomes.values() if o != "approved"]
    assert len(losers) == 1, outcomes
    assert "already approved" in losers[0]
    assert refreshed(kill_request).status == Status.APPROVED
    assert AuditEvent.objects.filter(action="approved").count() == 1
    assert len(sent.orders()) == 1
