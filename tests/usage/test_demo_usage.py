"""`make demo`'s synthetic hosts give the usage page busy and idle hours for several users."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuadmin.demo import fleet
from gpuadmin.usage.models import UsageDay
from tests.fleet.helpers import at
from tests.keys import deliver

pytestmark = pytest.mark.django_db


def test_the_demo_fleet_has_busy_and_idle_users(settings) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 5
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    for host in fleet.HOSTS[:3]:
        for seconds in (0, 5, 10):
            deliver(fleet.document(host, at(seconds)), received_at=at(seconds) + timedelta(seconds=1))
    busy = dict(UsageDay.objects.filter(busy_milliseconds__gt=0).values_list("user", "busy_milliseconds"))
    idle = dict(UsageDay.objects.filter(idle_milliseconds__gt=0).values_list("user", "idle_milliseconds"))
    assert set(busy) == {"alice", "carol", "erin"}
    assert set(idle) == {"bob", "dave"}
    assert idle["bob"] == 10_000
