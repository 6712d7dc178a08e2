"""The weekly digest: usage by person, failed kills, offline hosts, a section other apps add; sent once."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from gpuadmin.fairuse.models import Case, Policy
from gpuadmin.fleet.models import Host
from gpuadmin.notify.models import Account, Person
from gpuadmin.usage import digest
from gpuadmin.usage.models import DigestMessage
from gpuadmin.usage.queries import Period
from tests.fleet.helpers import at
from tests.usage.test_ledger import timeline

pytestmark = pytest.mark.django_db

WEEK = Period(date(2026, 11, 30), date(2026, 12, 6))


@pytest.fixture
def week(settings) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    timeline()
    alice = Person.objects.create(name="Alice Archer")
    Account.objects.create(person=alice, name="alice")


def test_the_digest_says_hours_by_person_and_offline_hosts(week) -> None:
    subject, body = digest.compose(WEEK)
    assert subject == "GPU usage, 2026-11-30 to 2026-12-06"
    assert "  Alice Archer: 0.0 h held, 0.0 h idle" in body
    assert "  bob (not mapped to a person): 0.0 h held" in body
    # Both hosts last sent on 2026-12-02: offline now.
    assert "  gpu-a: offline now (last seen 2026-12-02 12:01 UTC)" in body
    assert "Kills that failed or did not free memory\n  None." in body
    assert "Fair-use policies that fired\n  None." in body


def test_the_policies_that_acted_in_the_week_are_counted(week) -> None:
    host = Host.objects.get(name="gpu-a")
    idle = Policy.objects.create(name="idle-notebooks", condition=Policy.Condition.IDLE_HOLDER,
                                 mode=Policy.Mode.LIVE)
    Policy.objects.create(name="quiet", condition=Policy.Condition.IDLE_HOLDER, mode=Policy.Mode.LIVE)
    in_week, before = at(0), at(0) - timedelta(days=30)
    for key, notified, reminded in (("a", in_week, in_week), ("b", in_week, None), ("c", before, before)):
        Case.objects.create(policy=idle, key=key, host=host, summary="idle", condition_since=notified,
                            first_seen_at=notified, notified_at=notified, reminded_at=reminded)
    _, body = digest.compose(WEEK)
    assert ("Fair-use policies that fired\n"
            "  idle-notebooks: 2 notified, 1 reminded, 0 kill requests filed\n") in body
    assert "quiet:" not in body


def test_a_host_with_missing_history_is_called_offline_for_that_long(week) -> None:
    from gpuadmin.fleet.history.retention import bucket_of
    from gpuadmin.fleet.models import HostRollup

    host = Host.objects.get(name="gpu-b")
    Host.objects.filter(pk=host.pk).update(first_seen_at=at(0), history_rolled_up_until=at(3600),
                                           last_seen_at=at(100_000_000))
    HostRollup.objects.bulk_create(
        HostRollup(host=host, bucket=bucket, sample_count=1, zombies_min=0, zombies_mean=0, zombies_max=0,
                   d_state_min=0, d_state_mean=0, d_state_max=0, pids_in_use_min=1, pids_in_use_mean=1,
                   pids_in_use_max=1, pid_max=10)
        for bucket in range(bucket_of(at(0)), bucket_of(at(1800))))  # the hour's first half only
    body = digest.offline_section(WEEK, now=at(100_000_000)).lines
    assert body == ["gpu-a: offline now (last seen 2026-12-02 12:01 UTC)",
                    "gpu-b: no snapshot for about 0.5 h of the week"]


def test_history_in_the_30_minute_tier_counts_as_present(week) -> None:
    """Past GPUADMIN_HISTORY_FINE_DAYS only the 30-minute rollups are left of the week's first days."""
    from gpuadmin.fleet.history.retention import coarse_bucket_of
    from gpuadmin.fleet.models import HostRollupCoarse

    host = Host.objects.get(name="gpu-b")
    Host.objects.filter(pk=host.pk).update(first_seen_at=at(0), history_rolled_up_until=at(3600),
                                           history_coarse_rolled_up_until=at(3600),
                                           last_seen_at=at(100_000_000))
    HostRollupCoarse.objects.create(  # the hour's first half only
        host=host, bucket=coarse_bucket_of(at(0)), sample_count=180, fine_bucket_count=6, zombies_min=0,
        zombies_mean=0, zombies_max=0, d_state_min=0, d_state_mean=0, d_state_max=0, pids_in_use_min=1,
        pids_in_use_mean=1, pids_in_use_max=1, pid_max=10)
    body = digest.offline_section(WEEK, now=at(100_000_000)).lines
    assert body[1:] == ["gpu-b: no snapshot for about 0.5 h of the week"]


def test_queued_once_per_week_and_printed_by_the_dry_run(week, approver) -> None:
    person = Person.objects.create(name="Ada Approver", email="ada@example.org", user=approver)
    ids = digest.queue_digest(WEEK)
    assert digest.queue_digest(WEEK) == ids  # the same rows: a second run adds none
    assert DigestMessage.objects.get().person == person
    out = StringIO()
    call_command("send_usage_digest", "--dry-run", "--week-ending", "2026-12-06", stdout=out)
    assert out.getvalue().startswith("To: Ada Approver\nSubject: GPU usage, 2026-11-30 to 2026-12-06")
    assert DigestMessage.objects.count() == 1


def test_a_message_is_sent_once(week, approver, mailoutbox) -> None:
    Person.objects.create(name="Ada Approver", email="ada@example.org", user=approver)
    [message_id] = digest.queue_digest(WEEK)
    assert digest.deliver(message_id) is True
    assert digest.deliver(message_id) is False  # claimed already
    assert [m.subject for m in mailoutbox] == ["GPU usage, 2026-11-30 to 2026-12-06"]
    assert DigestMessage.objects.get().status == DigestMessage.Status.SENT


def test_last_week_is_the_seven_days_before_today() -> None:
    assert digest.last_week(date(2026, 12, 7)) == WEEK
    assert WEEK.end - WEEK.start == timedelta(days=6)


def test_kills_that_failed_or_kept_memory_are_named(requester) -> None:
    from gpuadmin.kills.models import KillRequest
    from gpuadmin.kills.states import Status
    from tests.kills.helpers import file, lab_snapshot, store_snapshot

    store_snapshot(lab_snapshot())
    failed, kept, fine = file(requester, 4300), file(requester, 4600), file(requester, 4120, start=412000)
    finished = timezone.make_aware(datetime(2026, 12, 2, 9, 0))
    KillRequest.objects.filter(pk=failed.pk).update(status=Status.FAILED, finished_at=finished,
                                                    result_detail="SIGKILL did not end it")
    KillRequest.objects.filter(pk=kept.pk).update(
        status=Status.SUCCEEDED, finished_at=finished, memory_expected_release_bytes=4 * 2**30,
        memory_released_bytes=2**30, memory_confirmed_at=finished)
    KillRequest.objects.filter(pk=fine.pk).update(status=Status.SUCCEEDED, finished_at=finished)
    assert digest.kills_section(WEEK).lines == [
        f"#{failed.pk} on gpu01: failed (SIGKILL did not end it)",
        f"#{kept.pk} on gpu01: 3 GiB of GPU memory not released",
    ]
    outside = Period(date(2026, 12, 3), date(2026, 12, 9))
    assert digest.kills_section(outside).lines == ["None."]
