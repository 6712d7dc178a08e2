"""After a kill, a later snapshot confirms how much GPU memory came back — once."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.fleet.models import Finding
from gpuadmin.kills import services
from tests.factories import GiB
from tests.keys import deliver
from tests.kills.helpers import GPU0, KILLED, file, lab_snapshot, refreshed

pytestmark = pytest.mark.django_db

@pytest.fixture
def ingest_after(django_capture_on_commit_callbacks):
    """ingest_after(kill_request, seconds, document): ingest ``document`` as taken ``seconds`` after the
    kill finished, through the real ingest path (which signals ``snapshot_ingested`` after commit)."""

    def _ingest(kill_request, seconds: float, document: dict[str, Any]) -> None:
        taken_at = kill_request.finished_at + timedelta(seconds=seconds)
        document["taken_at"] = taken_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        with django_capture_on_commit_callbacks(execute=True):
            deliver(json.dumps(document), received_at=taken_at + timedelta(seconds=1))

    return _ingest


def test_a_later_snapshot_confirms_the_memory_came_back(killed, ingest_after):
    ingest_after(killed, 5, lab_snapshot(drop=KILLED))
    kill_request = refreshed(killed)
    assert kill_request.memory_expected_release_bytes == 18 * GiB
    assert kill_request.memory_released_bytes == 18 * GiB
    assert kill_request.memory_confirmed_at is not None
    event = AuditEvent.objects.get(action="memory_released")
    assert event.kill_request_id == kill_request.pk
    assert event.details["released_bytes"] == 18 * GiB
    assert event.details["per_gpu"][GPU0]["released_bytes"] == 18 * GiB

    # Recorded once: the next snapshot adds nothing.
    ingest_after(killed, 15, lab_snapshot(drop=KILLED))
    assert AuditEvent.objects.filter(action="memory_released").count() == 1


def test_memory_the_driver_has_not_freed_yet_waits_for_a_later_snapshot(killed, ingest_after):
    # The processes are gone but the GPU still shows their 18 GiB used, now unattributed.
    stuck = lab_snapshot(drop=KILLED, extra_used={GPU0: 18 * GiB})
    ingest_after(killed, 5, stuck)
    assert refreshed(killed).memory_confirmed_at is None
    # The driver frees 12 GiB of it; after the settling time that is the answer.
    ingest_after(killed, 65, lab_snapshot(drop=KILLED, extra_used={GPU0: 6 * GiB}),
                 )
    kill_request = refreshed(killed)
    assert kill_request.memory_released_bytes == 12 * GiB
    event = AuditEvent.objects.get(action="memory_released")
    assert event.details["per_gpu"][GPU0]["unattributed_growth_bytes"] == 6 * GiB


def test_a_new_job_taking_memory_meanwhile_does_not_hide_the_release(killed, ingest_after):
    from tests.factories import proc

    newcomer = proc(5000, user="dave", uid=1003, name="python", gpu_memory={GPU0: 20 * GiB})
    document = lab_snapshot(drop=KILLED)
    document["processes"].append(newcomer)
    document["gpus"][0]["memory_used_bytes"] += 20 * GiB
    ingest_after(killed, 5, document)
    assert refreshed(killed).memory_released_bytes == 18 * GiB


def test_a_snapshot_taken_before_the_kill_finished_confirms_nothing(killed, ingest_after):
    ingest_after(killed, -2, lab_snapshot(drop=KILLED))
    assert refreshed(killed).memory_confirmed_at is None
    assert not AuditEvent.objects.filter(action="memory_released").exists()


@pytest.mark.usefixtures("lab")
def test_an_unkillable_finding_closes_when_a_snapshot_shows_the_process_gone(
    requester, approver, sent, approve_committed, ingest_after
):
    kill_request = file(requester, 4300)
    approve_committed(kill_request, approver)
    at = datetime.now(UTC) - timedelta(seconds=10)
    for seq, kind, fields in [
        (1, "started", {}),
        (2, "target_survived", {"pid": 4300, "start_time_ticks": 430000, "state": "D"}),
        (3, "finished", {"result": "unkillable"}),
    ]:
        order_id = refreshed(kill_request).order_request_id
        services.record_progress({"request_id": order_id, "seq": seq, "event": kind,
                                  "at": (at + timedelta(seconds=seq)).isoformat(), **fields})
    finding = Finding.objects.get(kind=Finding.Kind.UNKILLABLE)
    ingest_after(refreshed(kill_request), 5, lab_snapshot())
    finding.refresh_from_db()
    assert finding.is_open  # still there, still stuck
    ingest_after(refreshed(kill_request), 10, lab_snapshot(drop=(4300,)))
    finding.refresh_from_db()
    assert not finding.is_open


@pytest.mark.usefixtures("lab")
def test_an_unkillable_finding_is_looked_for_only_when_ingest_saw_one_open(
    requester, approver, sent, approve_committed, django_assert_num_queries
):
    kill_request = file(requester, 4300)
    finding = Finding.objects.create(
        host=kill_request.host, kind=Finding.Kind.UNKILLABLE, key="4300:430000", severity="critical",
        title="t", remedy="r", details={"pid": 4300, "start_time_ticks": 430000},
        first_seen_at=timezone.now(), last_seen_at=timezone.now(),
    )
    gone = lab_snapshot(drop=(4300,))
    # Ingest read the host's open findings with the snapshot: none unkillable then, nothing asked now.
    with django_assert_num_queries(0):
        assert services.resolve_gone_unkillable(kill_request.host, gone, open_kinds=frozenset()) == 0
    # Told one is open, or told nothing (it asks): the finding whose process is gone is closed.
    assert services.resolve_gone_unkillable(kill_request.host, gone,
                                            open_kinds={Finding.Kind.UNKILLABLE}) == 1
    finding.refresh_from_db()
    assert not finding.is_open
    Finding.objects.filter(pk=finding.pk).update(resolved_at=None)
    assert services.resolve_gone_unkillable(kill_request.host, lab_snapshot()) == 0  # still there
    assert services.resolve_gone_unkillable(kill_request.host, gone) == 1
    finding.refresh_from_db()
    assert not finding.is_open
    with django_assert_num_queries(1):  # asked: none open
        assert services.resolve_gone_unkillable(kill_request.host, gone) == 0
