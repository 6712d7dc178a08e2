"""Approve, reject, cancel: who may, when, and what the audit log says."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.kills import services
from gpuadmin.kills.states import Status
from tests.kills.helpers import actions, file, lab_snapshot, refreshed, store_snapshot

pytestmark = pytest.mark.django_db


@pytest.mark.usefixtures("lab")
def test_an_approver_approves_and_the_order_leaves_after_commit(
    requester, approver, sent, django_capture_on_commit_callbacks
):
    kill_request = file(requester, 4600)
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(kill_request.pk, approver)
        assert sent.orders() == []  # nothing leaves while the approval is uncommitted
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.APPROVED
    assert kill_request.approved_by_name == "april"
    assert kill_request.start_deadline == kill_request.decided_at + timedelta(seconds=120)
    assert kill_request.dispatched_at is not None
    assert len(sent.orders()) == 1
    assert actions(kill_request) == ["requested", "approved", "dispatched"]


def test_the_requester_cannot_approve_their_own_request(lab, requester, sent):
    from gpuadmin.accounts.roles import Role
    from tests.people import make_person

    both = make_person("bo", Role.REQUESTER, Role.APPROVER)
    kill_request = file(both, 4600)
    with pytest.raises(services.NotAllowed, match="a different approver must approve it"):
        services.approve(kill_request.pk, both)
    assert refreshed(kill_request).status == Status.PENDING
    assert actions(kill_request) == ["requested"]


def test_self_approval_is_allowed_by_setting_and_marked_in_the_log(
    lab, settings, sent, approve_committed
):
    from gpuadmin.accounts.roles import Role
    from tests.people import make_person

    settings.GPUADMIN_ALLOW_SELF_APPROVAL = True
    solo = make_person("solo", Role.REQUESTER, Role.APPROVER)
    kill_request = file(solo, 4600)
    approve_committed(kill_request, solo)
    assert refreshed(kill_request).self_approved is True
    event = AuditEvent.objects.get(action="approved")
    assert event.details["self_approved"] is True
    assert event.actor_name == "solo"


def test_a_requester_without_approver_role_cannot_approve(lab, requester, sent):
    kill_request = file(requester, 4600)
    with pytest.raises(services.NotAllowed, match="Only an approver can approve"):
        services.approve(kill_request.pk, requester)


@pytest.mark.usefixtures("lab")
def test_a_second_approval_is_told_it_is_already_approved(
    requester, approver, second_approver, sent, approve_committed
):
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    with pytest.raises(services.Conflict, match="already approved \\(by april"):
        services.approve(kill_request.pk, second_approver)
    assert actions(kill_request).count("approved") == 1
    assert len(sent.orders()) == 1


def test_a_rejection_needs_a_reason(lab, requester, approver):
    kill_request = file(requester, 4600)
    with pytest.raises(services.BadInput, match="needs a reason"):
        services.reject(kill_request.pk, approver, "  ")
    services.reject(kill_request.pk, approver, "that is carol's evaluation, ask her first")
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.REJECTED
    assert kill_request.decision_reason == "that is carol's evaluation, ask her first"
    assert AuditEvent.objects.get(action="rejected").details["reason"].startswith("that is carol's")


def test_rejected_is_final(lab, requester, approver):
    kill_request = file(requester, 4600)
    services.reject(kill_request.pk, approver, "no")
    with pytest.raises(services.Conflict, match="rejected, not pending"):
        services.approve(kill_request.pk, approver)


def test_the_requester_cancels_while_pending(lab, requester):
    kill_request = file(requester, 4600)
    services.cancel(kill_request.pk, requester, "found the owner, she will stop it")
    assert refreshed(kill_request).status == Status.CANCELLED
    assert actions(kill_request) == ["requested", "cancelled"]


def test_an_approved_request_can_be_cancelled_until_it_is_sent(
    lab, requester, approver, broker_down, approve_committed
):
    broker_down(True)
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    assert refreshed(kill_request).dispatched_at is None
    services.cancel(kill_request.pk, requester)
    assert refreshed(kill_request).status == Status.CANCELLED


def test_a_sent_order_cannot_be_cancelled(lab, requester, approver, sent, approve_committed):
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    with pytest.raises(services.Conflict, match="already sent to gpu01"):
        services.cancel(kill_request.pk, requester)


def test_someone_elses_requester_cannot_cancel(lab, requester, sent):
    from gpuadmin.accounts.roles import Role
    from tests.people import make_person

    kill_request = file(requester, 4600)
    other = make_person("otto", Role.REQUESTER)
    with pytest.raises(services.NotAllowed):
        services.cancel(kill_request.pk, other)


def test_sigkill_only_needs_the_approver_to_allow_it(
    lab, requester, approver, sent, approve_committed
):
    kill_request = file(requester, 4600, plan=[{"signal": "SIGKILL", "grace_seconds": 10}])
    with pytest.raises(services.BadInput, match="SIGKILL only"):
        services.approve(kill_request.pk, approver)
    assert refreshed(kill_request).status == Status.PENDING
    approve_committed(kill_request, approver, allow_sigkill_only=True)
    kill_request = refreshed(kill_request)
    assert kill_request.sigkill_only_allowed is True
    assert AuditEvent.objects.get(action="approved").details["sigkill_only_allowed"] is True


def test_approving_a_request_past_its_expiry_expires_it(lab, requester, approver, sent):
    kill_request = file(requester, 4600)
    later = timezone.now() + timedelta(seconds=3601)
    with pytest.raises(services.Conflict, match="expired before it was approved"):
        services.approve(kill_request.pk, approver, now=later)
    assert refreshed(kill_request).status == Status.EXPIRED
    assert actions(kill_request) == ["requested", "expired"]
    assert sent.orders() == []


def test_the_approval_records_what_changed_since_the_request(
    lab, requester, approver, sent, approve_committed
):
    from tests.factories import GiB, proc
    from tests.kills.helpers import GPU0

    kill_request = file(requester, 4120, include_descendants=True)
    store_snapshot(lab_snapshot(
        drop=(4123,),
        replace={4121: proc(4121, ppid=4120, user="alice", name="pt_data_worker",
                            gpu_memory={GPU0: 7 * GiB})},
    ))
    approve_committed(kill_request, approver)
    changes = AuditEvent.objects.get(action="approved").details["changes_since_request"]
    assert any("no longer in the snapshot" in c for c in changes["4123"])
    assert changes["4121"] == ["GPU memory 6 GiB → 7 GiB"]
    assert "4120" not in changes
    # What is expected to come back follows the newest snapshot the approver saw.
    assert refreshed(kill_request).memory_expected_release_bytes == (10 + 7) * GiB


@pytest.mark.usefixtures("lab")
def test_an_approval_rolled_back_sends_nothing(requester, approver, sent, django_capture_on_commit_callbacks):
    kill_request = file(requester, 4600)
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        services.approve(kill_request.pk, approver)
        raise RuntimeError("something after the approval failed")
    assert callbacks == []
    assert sent.orders() == []
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.PENDING and kill_request.dispatched_at is None
    assert actions(kill_request) == ["requested"]
