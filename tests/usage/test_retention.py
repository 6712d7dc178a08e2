"""The ledger is kept GPUADMIN_USAGE_DAYS and pruned in batches; a silent host's pending usage is written."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuadmin.usage.models import LifeUsage, UsageCursor, UsageDay
from gpuadmin.usage.retention import maintain_usage
from tests.factories import gpu, snapshot
from tests.fleet.helpers import at
from tests.keys import deliver
from tests.usage.test_ledger import alice, host_a, life, timeline

pytestmark = pytest.mark.django_db


def test_days_and_lives_older_than_the_keeping_time_go_the_rest_stays(settings) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    settings.GPUADMIN_USAGE_DAYS = 10
    timeline()
    assert (UsageDay.objects.count(), LifeUsage.objects.count()) == (4, 5)
    kept = maintain_usage(at(25) + timedelta(days=10) - timedelta(seconds=1))
    assert (kept.days_pruned, kept.lives_pruned) == (0, 0)
    # Lives last held more than ten days before go (carol and dave at 25 s, bob's two GPUs at 80 s),
    # alice's stays, and so does the day, not over ten days ago yet.
    some = maintain_usage(at(85) + timedelta(days=10))
    assert (some.days_pruned, some.lives_pruned) == (0, 4)
    assert list(LifeUsage.objects.values_list("pid", flat=True)) == [100]
    done = maintain_usage(at(90) + timedelta(days=11), batch_rows=2)
    assert (done.days_pruned, done.lives_pruned) == (4, 1)
    assert not UsageDay.objects.exists()
    assert not LifeUsage.objects.exists()


def test_a_host_that_went_silent_has_its_pending_usage_written(settings) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 60
    host_a(0, [alice()], util0=50)
    host_a(10, [alice()], util0=50)
    assert not LifeUsage.objects.exists()  # pending, in the cursor: no snapshot came to flush it
    assert maintain_usage(at(30)).hosts_flushed == 0  # not stale yet
    assert maintain_usage(at(75)).hosts_flushed == 1
    assert life(100, "GPU-sim-0000")[0] == 10_000
    assert UsageCursor.objects.get().pending == "[]"
    host_a(20, [alice()], util0=50)  # the host comes back: nothing counted twice
    assert maintain_usage(at(200)).hosts_flushed == 1
    assert life(100, "GPU-sim-0000")[0] == 20_000


def test_a_host_still_sending_is_left_to_ingest_when_its_clock_lags_centrals(settings) -> None:
    # Its cursor's times are its own clock's, ten minutes behind: by them it looks silent past the
    # window at once, though central heard from it a moment ago.
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 60
    behind = timedelta(minutes=10)
    for seconds in (0, 10):
        document = snapshot("gpu-a", processes=[alice()], taken_at=at(seconds),
                            gpus=[gpu(0, utilization_percent=50)])
        deliver(document, received_at=at(seconds + 1) + behind)
    assert maintain_usage(at(11) + behind + timedelta(seconds=30)).hosts_flushed == 0
    assert not LifeUsage.objects.exists()
    # Then it goes silent, by central's clock too.
    assert maintain_usage(at(11) + behind + timedelta(seconds=61)).hosts_flushed == 1
    assert life(100, "GPU-sim-0000")[0] == 10_000
