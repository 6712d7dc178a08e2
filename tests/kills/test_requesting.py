"""Filing a kill request: exact targets from the latest snapshot, refusals with reasons, the audit event."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from gpuadmin.kills import plans, services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from tests.factories import GiB
from tests.keys import enrol
from tests.kills.helpers import GPU0, lab_snapshot, store_snapshot

pytestmark = pytest.mark.django_db


def file(user, pid: int, **kwargs) -> KillRequest:
    kwargs.setdefault("reason", "job finished yesterday, memory still held")
    return services.file_request(user, host="gpu01", pid=pid, start_time_ticks=kwargs.pop("start", pid * 100),
                                 **kwargs)


def test_a_request_stores_exact_targets_with_identity_and_memory(lab, requester):
    kill_request = file(requester, 4120, include_descendants=True)
    assert kill_request.status == Status.PENDING
    assert kill_request.requested_by_name == "rick"
    assert kill_request.plan == plans.default_plan()
    targets = list(kill_request.targets.all())
    assert [(t.pid, t.start_time_ticks, t.is_descendant) for t in targets] == [
        (4120, 412000, False), (4121, 412100, True), (4123, 412300, True)
    ]
    launcher = targets[0]
    assert launcher.boot_id == lab.latest_snapshot.document["host"]["boot_id"]
    assert launcher.user == "alice" and launcher.uid == 1000
    assert launcher.cmdline == ["python", "train.py", "--epochs", "90"]
    assert len(launcher.cmdline_sha256) == 64
    assert launcher.gpu_memory_bytes == {GPU0: 10 * GiB}
    assert kill_request.memory_expected_release_bytes == 18 * GiB
    assert {e["pid"] for e in kill_request.excluded_targets} == {4122, 4124}


def test_filing_writes_a_requested_audit_event(lab, requester):
    kill_request = file(requester, 4600)
    event = AuditEvent.objects.get(action="requested")
    assert event.kill_request_id == kill_request.pk
    assert event.actor_name == "rick"
    assert event.host_name == "gpu01"
    assert event.process_users == "carol"
    assert "4600" in event.targets_summary
    assert event.details["reason"] == "job finished yesterday, memory still held"


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_a_reason_is_required(lab, requester, reason):
    with pytest.raises(services.BadInput, match="reason is required"):
        file(requester, 4600, reason=reason)
    assert KillRequest.objects.count() == 0


@pytest.mark.parametrize(
    ("pid", "why"),
    [
        (1, "PID 1"),
        (2, "kernel thread"),
        (4242, "agent itself"),
        (4240, "ancestor of the gpuadmin agent"),
        (4400, "protected"),
        (4500, "protected pattern"),
        (99999, "not in the latest snapshot"),
    ],
)
def test_refused_targets_file_nothing_and_say_why(lab, requester, pid, why):
    with pytest.raises(services.Refused, match=why) as refused:
        file(requester, pid)
    assert refused.value.status_code == 422
    assert KillRequest.objects.count() == 0
    assert not AuditEvent.objects.exists()


def test_a_zombie_is_refused_with_its_parent_offered(lab, requester):
    with pytest.raises(services.Refused) as refused:
        file(requester, 4201)
    offer = refused.value.extra["parent_offer"]
    assert offer["pid"] == 4199 and offer["name"] == "supervisor" and offer["zombie_count"] == 3


def test_a_d_state_target_is_filed_with_its_warning(lab, requester):
    kill_request = file(requester, 4300)
    assert any("uninterruptible" in w for w in kill_request.warnings)


def test_a_second_open_request_for_the_same_process_is_refused(lab, requester):
    first = file(requester, 4600)
    with pytest.raises(services.Conflict, match=f"already a target of request #{first.pk}"):
        file(requester, 4600)


def test_an_invalid_plan_is_refused(lab, requester):
    with pytest.raises(services.BadInput, match=r"plan: .*SIGKILL can only be the last step"):
        file(requester, 4600, plan=[{"signal": "SIGKILL", "grace_seconds": 5},
                                    {"signal": "SIGINT", "grace_seconds": 5}])


def test_a_viewer_cannot_file(lab, viewer):
    with pytest.raises(services.NotAllowed):
        file(viewer, 4600)


def test_an_unknown_host_is_not_found(lab, requester):
    with pytest.raises(services.NotFound, match="no host named 'gpu99'"):
        services.file_request(requester, host="gpu99", pid=4600, start_time_ticks=460000, reason="x")


def test_a_host_whose_key_is_not_accepted_cannot_be_targeted(db, requester):
    from gpuadmin.fleet.models import Host

    store_snapshot(lab_snapshot())
    Host.objects.filter(name="gpu01").update(key_accepted_at=None)
    with pytest.raises(services.Refused, match="gpu01 has no accepted key yet"):
        services.file_request(requester, host="gpu01", pid=4600, start_time_ticks=460000, reason="x")


def test_a_host_without_snapshot_cannot_be_targeted(db, requester):
    from gpuadmin.fleet.models import Host

    enrol(Host.objects.create(name="gpu02"))
    with pytest.raises(services.Refused, match="no snapshot from gpu02 yet"):
        services.file_request(requester, host="gpu02", pid=4600, start_time_ticks=460000, reason="x")


def test_a_protected_pattern_matches_the_executable_too_and_may_hold_commas(db, requester, settings):
    from tests.kills.helpers import lab_processes

    settings.GPUADMIN_PROTECTED_COMMAND_PATTERNS = [r"(^|/)redis-serv{1,2}er$"]
    record = next(p for p in lab_processes() if p["pid"] == 4600) | {"exe": "/usr/bin/redis-server"}
    store_snapshot(lab_snapshot(replace={4600: record}))
    with pytest.raises(services.Refused, match="its executable /usr/bin/redis-server matches"):
        file(requester, 4600)
