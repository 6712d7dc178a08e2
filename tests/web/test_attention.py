"""The nav's "needs attention" count on every page (gpuadmin/web/attention.py): offline hosts, critical
findings and requests waiting for approval, in two queries whatever the fleet's size."""

import re
from collections.abc import Iterator

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from gpuadmin.web.attention import CACHE_KEY, AttentionCount
from tests.fleet.helpers import make_offline, store, store_busy_host, store_critical_host
from tests.keys import enrol
from tests.kills.helpers import file

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def nothing_kept() -> Iterator[None]:
    cache.delete(CACHE_KEY)
    yield
    cache.delete(CACHE_KEY)


def nav_count(page: str) -> re.Match[str]:
    match = re.search(r'<a id="nav-attention" href="[^"]+" class="([^"]+)" title="([^"]+)">'
                      r'Needs attention <span class="count">(\d+)</span>', page)
    assert match, "no count in the nav"
    return match


def test_the_count_adds_offline_hosts_critical_findings_and_waiting_requests(requester):
    busy = enrol(store_busy_host("gpu01"))  # one critical finding (its orphans)
    make_offline(store("gpu02"))
    make_offline(store("gpu03"))
    file(requester, 101, host=busy.name)
    with CaptureQueriesContext(connection) as queries:
        count = AttentionCount.of_fleet(timezone.now())
    assert count == AttentionCount(offline_hosts=2, critical_findings=1, pending_approvals=1)
    assert count.total == 4
    assert len(queries) == 2


def test_the_count_does_not_cost_more_queries_with_more_hosts():
    for n in range(3):
        store_critical_host(f"node{n}")
    with CaptureQueriesContext(connection) as few:
        AttentionCount.of_fleet(timezone.now())
    for n in range(3, 30):
        store(f"node{n}")
    with CaptureQueriesContext(connection) as many:
        assert AttentionCount.of_fleet(timezone.now()).critical_findings == 3
    assert len(many) == len(few)


def test_every_page_shows_the_count_and_says_what_it_counts(viewer_client):
    make_offline(store("gpu02"))
    page = viewer_client.get(reverse("kill_requests")).content.decode()
    match = nav_count(page)
    assert match.group(3) == "1"
    assert "nav-attention-some" in match.group(1)
    assert match.group(2) == "1 offline host, 0 critical findings, 0 kill requests waiting for approval"


def test_the_fleet_page_counts_from_its_summary_and_keeps_it_for_the_other_pages(viewer_client):
    store("gpu01")
    assert nav_count(viewer_client.get(reverse("fleet")).content.decode()).group(3) == "0"
    make_offline(store("gpu02"))
    fleet = viewer_client.get(reverse("fleet")).content.decode()
    assert nav_count(fleet).group(3) == "1"
    # Another page within the poll interval shows what the fleet page counted, without counting again.
    with CaptureQueriesContext(connection) as queries:
        other = viewer_client.get(reverse("kill_requests")).content.decode()
    assert nav_count(other).group(3) == "1"
    assert not any("COUNT" in q["sql"].upper() and "fleet_finding" in q["sql"] for q in queries)


def test_nobody_logged_out_sees_a_count(client):
    make_offline(store("gpu02"))
    page = client.get(reverse("login")).content.decode()
    assert 'id="nav-attention"' not in page
