"""The process page: one process, alive or gone, with its history, relatives, findings and kill requests."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gpuadmin.fleet.models import Host
from gpuadmin.kills import services
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver, enrol

pytestmark = pytest.mark.django_db

GPU0 = "GPU-sim-0000"
# pid 100 launches 101 (holds GPU 0, has a child 102); 300 is a parent of a zombie.
LAUNCHER = proc(100, name="torchrun", cmdline=["torchrun", "train.py"], reasons=["ancestor"])
HOLDER_ARGV = ["python", "train.py", "--tag", "\x1b[31mred\u202e"]


def family(*, holder_memory: int = 8 * GiB, holder_state: str = "R") -> list[dict[str, Any]]:
    return [
        LAUNCHER,
        proc(101, ppid=100, state=holder_state, cmdline=HOLDER_ARGV, gpu_memory={GPU0: holder_memory},
             device_files=["/dev/nvidia0"]),
        proc(102, ppid=101, name="worker", reasons=["descendant"]),
        proc(300, name="leaky", reasons=["ancestor"]),
        proc(301, ppid=300, state="Z"),
    ]


def store(processes: list[dict[str, Any]], minutes_ago: float) -> None:
    taken_at = timezone.now() - timedelta(minutes=minutes_ago)
    used = sum(sum(v for v in p["gpu_memory_bytes"].values()) for p in processes)
    document = snapshot("gpu01", processes=processes, gpus=[gpu(0, used=used)], taken_at=taken_at)
    deliver(json.dumps(document), received_at=taken_at + timedelta(seconds=1))


def page(client: Client, pid: int, start: int | None = None) -> tuple[int, str]:
    start = start if start is not None else pid * 100
    response = client.get(reverse("process_detail", args=["gpu01", pid, start]))
    return response.status_code, response.content.decode()


def test_a_running_process_shows_who_what_its_family_and_its_chart(viewer_client: Client) -> None:
    store(family(holder_memory=2 * GiB), 3)
    store(family(holder_memory=8 * GiB), 2)
    status, html = page(viewer_client, 101)
    assert status == 200
    assert "running" in html
    assert "alice" in html
    # Controls are shown as escapes, never passed to the browser raw.
    assert "\x1b" not in html and "\u202e" not in html
    assert '<span class="arg">train.py</span> <wbr><span class="arg">--tag</span>' in html
    assert "\\x1b" in html and "\\u202e" in html
    assert 'href="/hosts/gpu01/processes/100-10000/">100</a>' in html  # parent
    assert 'href="/hosts/gpu01/processes/102-10200/">102</a>' in html  # child
    assert "/dev/nvidia0" in html
    assert 'data-chart="process" data-src="/api/v1/hosts/gpu01/processes/101-10100/"' in html
    assert "peak 8 GiB" in html
    # A viewer cannot request kills.
    assert "Request kill" not in html


def test_a_requester_may_request_a_kill_while_it_lives(requester: User) -> None:
    client = Client()
    client.force_login(requester)
    store(family(), 1)
    _, html = page(client, 101)
    assert "/kills/new/?host=gpu01&amp;pid=101&amp;start=10100" in html


def test_a_process_in_d_state_is_not_killable_now(requester: User) -> None:
    client = Client()
    client.force_login(requester)
    store(family(holder_state="D"), 1)
    _, html = page(client, 101)
    assert "not killable now" in html
    assert "Request kill" not in html


def test_a_gone_process_stays_reachable_with_its_kill_requests_and_findings(
    viewer_client: Client, requester: User
) -> None:
    orphan = proc(101, ppid=1, orphaned=True, pgid=100, sid=100, gpu_memory={GPU0: 4 * GiB})
    store([orphan], 3)
    enrol(Host.objects.get(name="gpu01"))  # requests are filed only for hosts whose key was accepted
    kill_request = services.file_request(requester, host="gpu01", pid=101, start_time_ticks=10100,
                                         reason="launcher died")
    store([], 1)
    status, html = page(viewer_client, 101)
    assert status == 200
    assert "gone" in html
    assert "Request kill" not in html
    assert f'href="/kills/{kill_request.pk}/">#{kill_request.pk}</a>' in html
    assert "Pending" in html
    findings = re.search(r"Findings it was part of</h2>(.*?)<h2>", html, re.S).group(1)  # type: ignore[union-attr]
    assert 'data-kind="orphan_gpu"' in findings
    assert '<span class="badge badge-warning" title="re-parented to PID 1' in html  # says "orphan"


def test_a_zombie_parent_without_history_has_a_page_while_in_the_snapshot(viewer_client: Client) -> None:
    store(family(), 1)
    status, html = page(viewer_client, 300)
    assert status == 200
    assert "None recorded" in html
    assert 'href="/hosts/gpu01/processes/301-30100/">301</a>' in html
    assert 'data-kind="zombies"' in html


def test_a_zombie_parent_marks_its_defunct_children_and_offers_the_reap(requester: User) -> None:
    client = Client()
    client.force_login(requester)
    store(family(), 1)
    _, html = page(client, 300)
    assert '<span class="badge badge-warning">1 defunct child</span>' in html
    child = re.search(r'<div class="defunct">.*?</div>', html, re.S).group(0)  # type: ignore[union-attr]
    assert ">301</a>" in child and ">defunct</span>" in child
    reap = "/kills/new/?host=gpu01&amp;pid=300&amp;start=30000&amp;plan=reap"
    assert f'<a class="button button-secondary reap" href="{reap}">' in html
    # The zombie's own page says what it is and points at the same action, on its parent.
    _, zombie = page(client, 301)
    assert '<span class="badge badge-warning">zombie</span>' in zombie
    assert f'href="{reap}">Ask the parent to reap (SIGCHLD)</a>' in zombie
    # A process without defunct children offers no reap.
    assert "plan=reap" not in page(client, 101)[1]


def test_an_unknown_process_or_wrong_start_time_is_404(viewer_client: Client) -> None:
    store(family(), 1)
    assert page(viewer_client, 101, start=1)[0] == 404
    assert page(viewer_client, 999)[0] == 404
    assert viewer_client.get(reverse("process_detail", args=["nope", 1, 1])).status_code == 404


def test_the_host_page_links_each_process_to_its_page(viewer_client: Client) -> None:
    store(family(), 1)
    html = viewer_client.get(reverse("host_detail", args=["gpu01"])).content.decode()
    assert '<a class="process-link" href="/hosts/gpu01/processes/101-10100/">101</a>' in html
    assert 'href="/hosts/gpu01/processes/301-30100/">301</a>' in html


def test_the_host_page_switches_the_chart_range_as_a_fragment(viewer_client: Client) -> None:
    store(family(), 1)
    url = reverse("host_detail", args=["gpu01"])
    html = viewer_client.get(url).content.decode()
    # The last hour first: a fresh install has minutes of history, not a day of single dots.
    assert 'data-history-src="/api/v1/hosts/gpu01/history/?range=1h"' in html
    # Each range link puts its range into the address and has an id, so htmx keeps the focus on it.
    assert 'id="range-24h" hx-get="/hosts/gpu01/?range=24h"' in html and 'hx-push-url="?range=24h"' in html
    assert 'data-chart="gpu" data-gpu-uuid="GPU-sim-0000"' in html
    assert 'data-chart="gpu-health" data-gpu-uuid="GPU-sim-0000"' in html  # temperature and power
    assert "<script>" not in html  # charts are wired by data- attributes and static/js/charts.js
    fragment = viewer_client.get(url, {"range": "7d"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="host-history")
    text = fragment.content.decode()
    assert text.lstrip().startswith("<section id=\"host-history\"") or 'id="host-history"' in text[:400]
    assert 'data-history-src="/api/v1/hosts/gpu01/history/?range=7d"' in text
    assert "host-processes" not in text
    # A range the page does not know falls back to the default.
    assert "history/?range=1h" in viewer_client.get(url, {"range": "5y"}).content.decode()
