"""The order's deadline on the host's clock: central moves it by the offset its last snapshot showed.

A host's clock may run ahead of or behind central's. The agent compares the
order's ``host_deadline`` with its own clock; central computes it from the
host's newest snapshot (taken_at on the host's clock, received_at on
central's). Here a host runs 4 minutes ahead (central refuses snapshots more
than 5 minutes ahead, fleet/intake/validation.py) or 10 minutes behind, and the
agent's check runs with the host's skewed clock. The other way, the agent's
reports carry its clock, and central's deadline for its "finished" still counts
on central's.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.kills import services
from gpuadmin.kills.services.dispatch import host_deadline
from gpuadmin.kills.states import Status
from gpuadmin.wire.kill_order import OrderRefused, verify_order
from gpuadmin.wire.kill_protocol import OrderRefusal
from tests.kills.helpers import file, refreshed

pytestmark = pytest.mark.django_db


def _order_for_a_host_off_by(skew: timedelta, requester, approver, sent, approve_committed, **filing):
    # The lab snapshot was taken "a minute ago" on a correct clock; on a skewed
    # host the same document arrives when central's clock reads taken_at - skew.
    latest = LatestSnapshot.objects.get(host__name="gpu01")
    latest.received_at = datetime.fromisoformat(latest.document["taken_at"]) - skew
    latest.save(update_fields=["received_at"])
    kill_request = file(requester, 4120, **filing)
    approve_committed(kill_request, approver)
    return refreshed(kill_request), sent.orders()[-1]


@pytest.mark.usefixtures("lab")
@pytest.mark.parametrize("skew_minutes", [4, -10, 0])
def test_the_order_carries_the_deadline_on_the_hosts_clock(
    skew_minutes, requester, approver, sent, approve_committed,
):
    skew = timedelta(minutes=skew_minutes)
    kill_request, message = _order_for_a_host_off_by(skew, requester, approver, sent, approve_committed)
    assert kill_request.start_deadline is not None
    assert host_deadline(kill_request) == kill_request.start_deadline + skew
    central_now = time.time()
    host_now = central_now + skew.total_seconds()

    # Fresh on central's clock: the host, reading its own clock, runs it.
    order = verify_order(message, central_key=settings.GPUADMIN_CENTRAL_PUBLIC_KEY, host_name="gpu01",
                         now=host_now)
    assert datetime.fromisoformat(order["deadline"]) == kill_request.start_deadline
    assert datetime.fromisoformat(order["host_deadline"]) == kill_request.start_deadline + skew

    # A moment past central's deadline is past it on the host's clock too: never run late.
    late = kill_request.start_deadline.timestamp() + 0.001 + skew.total_seconds()
    with pytest.raises(OrderRefused) as refused:
        verify_order(message, central_key=settings.GPUADMIN_CENTRAL_PUBLIC_KEY, host_name="gpu01", now=late)
    assert refused.value.reason is OrderRefusal.EXPIRED
    assert "this host's clock" in refused.value.detail


@pytest.mark.usefixtures("lab")
def test_an_order_without_the_correction_is_what_a_skewed_host_gets_wrong(
    requester, approver, sent, approve_committed,
):
    """Why the correction exists: compared with the raw deadline, a host 10 minutes
    behind would still start the order 10 minutes after central gave up on it."""
    skew = timedelta(minutes=-10)
    kill_request, message = _order_for_a_host_off_by(skew, requester, approver, sent, approve_committed)
    host_now_past_deadline = kill_request.start_deadline.timestamp() + 60 + skew.total_seconds()
    assert host_now_past_deadline < kill_request.start_deadline.timestamp()  # the raw check would pass
    with pytest.raises(OrderRefused) as refused:
        verify_order(message, central_key=settings.GPUADMIN_CENTRAL_PUBLIC_KEY, host_name="gpu01",
                     now=host_now_past_deadline)
    assert refused.value.reason is OrderRefusal.EXPIRED


@pytest.mark.usefixtures("lab")
def test_a_host_clock_behind_does_not_fail_a_kill_still_in_its_plan(
    requester, approver, sent, approve_committed,
):
    """The agent writes its "started" on its own clock, 90 s behind central's; the sweeper,
    on central's clock, must still give it the plan's 20 s and the margin from when it began."""
    skew = timedelta(seconds=-90)
    plan = [{"signal": "SIGTERM", "grace_seconds": 20}]
    kill_request, _message = _order_for_a_host_off_by(skew, requester, approver, sent, approve_committed,
                                                      plan=plan)
    central_now = timezone.now()
    services.record_progress({"request_id": kill_request.order_request_id, "seq": 1, "event": "started",
                              "at": (central_now + skew).isoformat()})
    kill_request = refreshed(kill_request)
    assert kill_request.started_at == central_now + skew  # shown as the agent reported it

    # 15 s into the 20 s grace period: still running.
    assert services.sweep(now=central_now + timedelta(seconds=15)).failed == 0
    assert refreshed(kill_request).status == Status.RUNNING
    # An agent silent past the plan and the margin, on central's clock, is still failed.
    assert services.sweep(now=central_now + timedelta(seconds=20 + 60 + 1)).failed == 1
    assert refreshed(kill_request).status == Status.FAILED
