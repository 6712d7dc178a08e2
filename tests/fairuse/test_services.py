"""Live policies over real ingested snapshots (signed, through receive_snapshot), with a clock the
test holds: notify, "still needed" (snoozed, bounded), notify again, then a kill request in the
policy's name that waits for an approver; and the dry run of the same history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.audit.models import AuditEvent
from gpuadmin.fairuse import dry_run, services
from gpuadmin.fairuse.models import Case, Notice, Policy
from gpuadmin.fairuse.states import CaseState
from gpuadmin.kills.states import Status
from gpuadmin.notify.models import Account, Person
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver

pytestmark = pytest.mark.django_db

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=4)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def ingest(minutes: float, *, utilization: int = 0, held: bool = True) -> None:
    processes = [proc(4120, uid=1000, user="alice", name="python", cmdline=["python", "notebook.py"],
                      gpu_memory={"GPU-sim-0000": 10 * GiB})] if held else []
    deliver(snapshot("gpu01", taken_at=at(minutes), processes=processes,
                     gpus=[gpu(0, used=10 * GiB if held else 0, utilization_percent=utilization)]),
            received_at=at(minutes))


@pytest.fixture
def alice(viewer):
    person = Person.objects.create(name="Alice", email="alice@lab.example", user=viewer)
    Account.objects.create(person=person, uid=1000, name="alice")
    return person


def idle_policy(**kwargs) -> Policy:
    settings = {"name": "idle notebooks", "condition": Policy.Condition.IDLE_HOLDER, "mode": Policy.Mode.LIVE,
                "minutes": 60, "notify_again_after_minutes": 30, "request_after_minutes": 30,
                "snooze_minutes": 60, "max_snooze_minutes": 60, **kwargs}
    return Policy.objects.create(**settings)


def steps() -> list[str]:
    return [e.details["step"] for e in AuditEvent.objects.filter(action="fair_use_step").order_by("sequence")]


def test_notify_snooze_notify_again_then_a_kill_request_that_waits_for_approval(alice, viewer, approver):
    policy = idle_policy()
    ingest(0)
    ingest(59)
    assert services.evaluate(now=at(59)) == 0  # idle 59 minutes: nothing yet
    assert not Case.objects.exists()

    ingest(61)
    services.evaluate(now=at(61))
    (case,) = Case.objects.all()
    assert case.status == CaseState.NOTIFIED and case.person == alice
    (notice,) = Notice.objects.all()
    assert notice.person == alice and "/me/gpus/" in notice.body
    assert f"/fair-use/cases/{case.pk}/" in notice.body

    services.snooze(case.pk, viewer, "a long evaluation waits on input", now=at(62))
    ingest(100)
    services.evaluate(now=at(100))
    assert Case.objects.get().status == CaseState.SNOOZED  # snoozed until 62 + 60
    ingest(123)
    services.evaluate(now=at(123))
    case.refresh_from_db()
    assert case.status == CaseState.REMINDED and Notice.objects.count() == 2
    # The snooze is bounded: its 60 minutes are used up.
    with pytest.raises(services.NotAllowed, match="snoozed for the policy's 60 minutes already"):
        services.snooze(case.pk, viewer, "still evaluating", now=at(124))

    ingest(152)
    services.evaluate(now=at(152))
    assert Case.objects.get().status == CaseState.REMINDED  # 29 minutes after the second notice
    ingest(154)
    services.evaluate(now=at(154))
    case.refresh_from_db()
    assert case.status == CaseState.REQUESTED
    kill_request = case.kill_request
    assert kill_request.status == Status.PENDING  # never a kill without an approver
    assert kill_request.requested_by_name == "policy-idle-notebooks"
    assert [(t.pid, t.start_time_ticks) for t in kill_request.targets.all()] == [(4120, 412000)]
    assert steps() == ["notified", "snoozed", "reminded", "requested"]
    snoozed = AuditEvent.objects.get(action="fair_use_step", details_json__contains="snoozed")
    assert snoozed.actor_name == viewer.get_username()
    assert snoozed.details["reason"] == "a long evaluation waits on input"
    assert policy.pk  # the policy's requests are approved like any other


def test_a_case_whose_holder_went_busy_is_resolved(alice):
    idle_policy()
    ingest(0)
    ingest(61)
    services.evaluate(now=at(61))
    ingest(62, utilization=80)
    services.evaluate(now=at(62))
    assert Case.objects.get().status == CaseState.RESOLVED
    assert steps() == ["notified", "resolved"]


def test_only_the_holder_may_say_still_needed(alice, approver):
    idle_policy()
    ingest(0)
    ingest(61)
    services.evaluate(now=at(61))
    with pytest.raises(services.NotAllowed, match="only the person who holds it"):
        services.snooze(Case.objects.get().pk, approver, "mine", now=at(62))


def test_a_dry_run_policy_does_nothing_and_lists_the_idle_holder(alice):
    policy = idle_policy(mode=Policy.Mode.DRY_RUN)
    for minute in range(0, 95, 5):
        ingest(minute)
    assert services.evaluate(now=at(95)) == 0
    assert not Case.objects.exists()
    (would,) = dry_run.would_have(policy, at(95))
    assert (would.host_name, would.pid, would.who) == ("gpu01", 4120, "alice")
    assert would.notified_at == at(60) and would.reminded_at == at(90) and would.requested_at is None


def test_creating_changing_and_deleting_a_policy_in_the_admin_is_audited(django_user_model):
    from django.test import Client

    root = django_user_model.objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(root)
    form = {"name": "idle notebooks", "condition": "idle_holder", "mode": "dry_run", "scope": "all",
            "minutes": 60, "max_gpus": 4, "notify_again_after_minutes": 30, "request_after_minutes": 30,
            "snooze_minutes": 60, "max_snooze_minutes": 120, "created_at_0": "2026-12-01",
            "created_at_1": "00:00:00"}
    assert client.post("/admin/fairuse/policy/add/", form).status_code == 302
    policy = Policy.objects.get()
    assert client.post(f"/admin/fairuse/policy/{policy.pk}/change/",
                       {**form, "mode": "live"}).status_code == 302
    assert client.post(f"/admin/fairuse/policy/{policy.pk}/delete/", {"post": "yes"}).status_code == 302
    events = AuditEvent.objects.filter(action="policy_changed").order_by("sequence")
    assert [(e.details["change"], e.details["policy"]["mode"]) for e in events] == [
        ("created", "dry_run"), ("changed", "live"), ("deleted", "live")]
    assert {e.actor_name for e in events} == {"root"}


def test_a_notice_is_mailed_once_however_many_tasks_name_it(alice, settings):
    from django.core import mail

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    idle_policy()
    ingest(0)
    ingest(61)
    services.evaluate(now=at(61))
    notice = Notice.objects.get()
    assert services.deliver_notice(notice.pk) and services.deliver_notice(notice.pk)
    (sent,) = mail.outbox
    assert sent.to == ["alice@lab.example"] and "/me/gpus/" in sent.body
    notice.refresh_from_db()
    assert notice.status == Notice.Status.SENT


def test_a_case_on_a_host_gone_offline_waits_for_it(alice):
    idle_policy()
    ingest(0)
    ingest(61)
    services.evaluate(now=at(61))
    assert services.evaluate(now=at(200)) == 0  # no snapshot since minute 61: stale, nothing done
    assert Case.objects.get().status == CaseState.NOTIFIED
    ingest(201)
    services.evaluate(now=at(201))
    assert Case.objects.get().status == CaseState.REMINDED


def test_a_minute_with_nothing_due_and_nothing_changed_writes_no_case(alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    idle_policy()
    ingest(0)
    ingest(61)
    services.evaluate(now=at(61))  # notified
    ingest(62)

    def case_writes(now: datetime) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            services.evaluate(now=now)
        return [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "fairuse_case"')]

    assert case_writes(at(62)) == []  # notified a minute ago, the same holding: nothing to do
    def grown(minutes: float) -> None:
        deliver(snapshot("gpu01", taken_at=at(minutes), gpus=[gpu(0, used=12 * GiB, utilization_percent=0)],
                         processes=[proc(4120, uid=1000, user="alice", name="python",
                                         cmdline=["python", "notebook.py"],
                                         gpu_memory={"GPU-sim-0000": 12 * GiB})]), received_at=at(minutes))

    grown(63)
    assert len(case_writes(at(63))) == 1  # the holding grew: the case is written
    case = Case.objects.get()
    assert case.held_bytes == 12 * GiB and case.status == CaseState.NOTIFIED
    grown(90)
    assert case_writes(at(90)) == []
    grown(91)
    assert len(case_writes(at(91))) == 1  # notify again is due: reminded
    assert Case.objects.get().status == CaseState.REMINDED
