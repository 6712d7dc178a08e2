"""Self-service: a person stops their own real process with no approver; a target of another uid
is refused by central (nothing filed); the order carries the allowed uids the agent checks
again (tests/probe/kill/test_self_service_orders.py crafts orders the agent refuses)."""

from __future__ import annotations

import json
import os

import pytest

from gpuadmin.agent import killing
from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.sentences import describe, sentence_text
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from gpuadmin.probe import procfs
from gpuadmin.wire.kill_protocol import SELF_SERVICE_ORDER_VERSION
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import install_agent_key
from tests.kills.helpers import real_record, refreshed, start_trainer, store_snapshot

pytestmark = pytest.mark.django_db

OTHER_UID = os.getuid() + 4242


@pytest.fixture
def run_order(settings, tmp_path, monkeypatch, sent):
    """The agent's own code, as host gpu01, its signed reports going straight into central."""
    settings.DATA_DIR = tmp_path / "agent-data"
    settings.GPUADMIN_HOST_NAME = "gpu01"
    install_agent_key(settings.DATA_DIR, "gpu01")
    monkeypatch.setattr(killing, "report_to_central",
                        lambda event: services.receive_report(killing.signed_report(event)))
    return lambda: killing.execute(sent.orders()[-1])


def stop(user, pid, start, own_uids=None):
    own_uids = (os.getuid(),) if own_uids is None else own_uids
    return services.stop_own_processes(user, host="gpu01", own_uids=own_uids, person_name="Alice",
                                       pid=pid, start_time_ticks=start)


def test_a_person_stops_their_own_real_process_with_no_approver(
    tmp_path, viewer, run_order, django_capture_on_commit_callbacks
):
    child, _ = start_trainer(tmp_path, "checkpoint-on-sigint")
    store_snapshot(snapshot("gpu01", boot_id=procfs.read_boot_id(), gpus=[gpu(0, used=3 * GiB)],
                            processes=[real_record(child.pid, gpu_memory={"GPU-sim-0000": 3 * GiB})]))
    with django_capture_on_commit_callbacks(execute=True):
        kill_request = stop(viewer, child.pid, procfs.read_stat(child.pid).start_time_ticks)
    assert kill_request.status == Status.APPROVED and kill_request.self_service
    assert kill_request.approved_by_name == viewer.get_username()  # nobody else was asked
    finished = run_order()
    child.wait(timeout=10)
    assert finished["result"] == "succeeded"
    assert refreshed(kill_request).status == Status.SUCCEEDED
    approved = AuditEvent.objects.get(kill_request_id=kill_request.pk, action="approved")
    assert approved.details["self_service"] is True
    assert approved.details["allowed_uids"] == [os.getuid()]
    assert f"self-service: the owner stopping their own processes, no second admin (the agent signals " \
        f"only uid {os.getuid()})" in sentence_text(describe(approved))


def test_the_order_is_a_self_service_order_naming_the_targets_uids(lab, viewer, sent,
                                                                   django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        stop(viewer, 4600, 460000, own_uids=(1002,))
    (message,) = sent.orders()
    order = json.loads(message["text"])
    assert order["order_version"] == SELF_SERVICE_ORDER_VERSION
    assert order["self_service"] == {"allowed_uids": [1002], "person": viewer.get_username()}


def test_a_process_of_another_uid_is_refused_at_central_and_nothing_is_filed(viewer, sent):
    store_snapshot(snapshot("gpu01", processes=[proc(4120, uid=OTHER_UID, user="bob",
                                                     gpu_memory={"GPU-sim-0000": GiB})]))
    with pytest.raises(services.Refused, match="not yours on gpu01"):
        stop(viewer, 4120, 412000)
    assert not KillRequest.objects.exists() and sent.orders() == []


def test_a_descendant_of_another_uid_refuses_the_whole_request(viewer):
    store_snapshot(snapshot("gpu01", processes=[
        proc(4120, uid=1000, gpu_memory={"GPU-sim-0000": GiB}),
        proc(4121, ppid=4120, uid=OTHER_UID, user="bob", gpu_memory={"GPU-sim-0000": GiB}),
    ]))
    with pytest.raises(services.Refused, match="PID 4121"):
        services.stop_own_processes(viewer, host="gpu01", own_uids={1000}, person_name="Alice", pid=4120,
                                    start_time_ticks=412000, include_descendants=True)
    assert not KillRequest.objects.exists()


def test_the_setting_turns_self_service_off(lab, viewer, settings):
    settings.GPUADMIN_SELF_SERVICE = False
    with pytest.raises(services.NotAllowed, match="GPUADMIN_SELF_SERVICE"):
        stop(viewer, 4120, 412000, own_uids=(1000,))


def test_someone_with_no_accounts_on_the_host_stops_nothing(lab, viewer):
    with pytest.raises(services.NotAllowed, match="no account on this host"):
        stop(viewer, 4120, 412000, own_uids=())
