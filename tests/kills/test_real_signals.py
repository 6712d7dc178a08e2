"""Request → approval → the real executor signalling real processes, its reports
recorded by central (in process, no broker): statuses, outcomes and audit events
follow what actually happened to the process."""

from __future__ import annotations

import pytest

from gpuadmin.agent import killing
from gpuadmin.audit.models import AuditEvent
from gpuadmin.kills import services
from gpuadmin.kills.states import Status
from gpuadmin.probe import procfs
from tests.factories import GiB, gpu, snapshot
from tests.keys import install_agent_key
from tests.kills.helpers import actions, file, real_record, refreshed, start_trainer, store_snapshot

pytestmark = pytest.mark.django_db

FAST_PLAN = [
    {"signal": "SIGINT", "grace_seconds": 1},
    {"signal": "SIGTERM", "grace_seconds": 1},
    {"signal": "SIGKILL", "grace_seconds": 2},
]


@pytest.fixture
def agent_in_process(settings, tmp_path, monkeypatch, sent):
    """Run orders through the agent's own code (as host gpu01, with its accepted test key), its
    signed reports going straight into central's receiving service."""
    settings.DATA_DIR = tmp_path / "agent-data"
    settings.GPUADMIN_HOST_NAME = "gpu01"
    install_agent_key(settings.DATA_DIR, "gpu01")
    monkeypatch.setattr(killing, "report_to_central",
                        lambda event: services.receive_report(killing.signed_report(event)))

    def run_sent_order() -> dict:
        (order,) = sent.orders()
        return killing.execute(order)

    return run_sent_order


def kill_via_request(child, requester, approver, approve_committed, run_order):
    store_snapshot(snapshot(
        "gpu01", boot_id=procfs.read_boot_id(), gpus=[gpu(0, used=3 * GiB)],
        processes=[real_record(child.pid, gpu_memory={"GPU-sim-0000": 3 * GiB})],
    ))
    kill_request = file(requester, child.pid, start=procfs.read_stat(child.pid).start_time_ticks,
                        plan=FAST_PLAN)
    approve_committed(kill_request, approver)
    finished = run_order()
    child.wait(timeout=10)
    return refreshed(kill_request), finished


def signals_sent(kill_request) -> list[str]:
    return [e.details["signal"] for e in AuditEvent.objects.filter(
        action="signal_sent", kill_request_id=kill_request.pk).order_by("sequence")]


def test_a_trainer_that_checkpoints_on_sigint_ends_there(
    tmp_path, requester, approver, approve_committed, agent_in_process
):
    child, checkpoint = start_trainer(tmp_path, "checkpoint-on-sigint")
    kill_request, finished = kill_via_request(child, requester, approver, approve_committed, agent_in_process)
    assert finished["result"] == "succeeded"
    assert kill_request.status == Status.SUCCEEDED
    assert checkpoint.read_text().startswith("saved on SIGINT")
    assert signals_sent(kill_request) == ["SIGINT"]  # no SIGTERM, no SIGKILL
    target = kill_request.targets.get()
    assert target.outcome in ("exited", "exited_not_reaped") and target.last_signal == "SIGINT"
    assert actions(kill_request) == [
        "requested", "approved", "dispatched", "started", "signal_sent", "target_exited", "finished"
    ]


def test_a_trainer_that_ignores_everything_catchable_gets_sigkill(
    tmp_path, requester, approver, approve_committed, agent_in_process
):
    child, checkpoint = start_trainer(tmp_path, "ignore-both")
    kill_request, _ = kill_via_request(child, requester, approver, approve_committed, agent_in_process)
    assert kill_request.status == Status.SUCCEEDED
    assert signals_sent(kill_request) == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert child.returncode == -9
    assert not checkpoint.exists()


def test_the_same_order_delivered_twice_runs_once_and_central_records_it_once(
    tmp_path, requester, approver, approve_committed, agent_in_process
):
    child, checkpoint = start_trainer(tmp_path, "ignore-sigint")
    kill_request, first = kill_via_request(child, requester, approver, approve_committed, agent_in_process)
    again = agent_in_process()  # a redelivery of the same message
    assert again["duplicate"] is True and again["seq"] == first["seq"]
    assert refreshed(kill_request).status == Status.SUCCEEDED
    assert signals_sent(kill_request) == ["SIGINT", "SIGTERM"]
    assert actions(kill_request).count("finished") == 1
    assert checkpoint.read_text().startswith("saved on SIGTERM")


@pytest.mark.usefixtures("agent_in_process")
def test_an_order_changed_in_one_byte_signals_nothing_and_the_refusal_is_audited(
    tmp_path, requester, approver, approve_committed, sent
):
    child, _ = start_trainer(tmp_path, "ignore-sigint")
    try:
        store_snapshot(snapshot("gpu01", boot_id=procfs.read_boot_id(), processes=[real_record(child.pid)]))
        kill_request = file(requester, child.pid, start=procfs.read_stat(child.pid).start_time_ticks,
                            plan=FAST_PLAN)
        approve_committed(kill_request, approver)
        (message,) = sent.orders()
        altered = dict(message, text=message["text"].replace('"SIGINT"', '"SIGKILL"'))

        answer = killing.execute(altered)

        assert answer["event"] == "order_refused" and answer["reason"] == "bad_signature"
        assert child.poll() is None  # not signalled
        assert refreshed(kill_request).status == Status.APPROVED  # the real order may still come
        refusal = AuditEvent.objects.get(action="order_refused")
        assert refusal.kill_request_id == kill_request.pk and refusal.host_name == "gpu01"
        assert refusal.details["summary"].startswith("order refused by host: bad_signature")
    finally:
        child.kill()
        child.wait()
