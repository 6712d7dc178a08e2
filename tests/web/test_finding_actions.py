"""Findings on the host page offer their remedy as actions, and never a kill where a kill cannot help."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import store, store_busy_host
from tests.keys import enrol

pytestmark = pytest.mark.django_db


def finding(html: str, kind: str) -> str:
    match = re.search(rf'<li class="card finding[^"]*" data-kind="{kind}">.*?</li>', html, re.S)
    assert match, f"no {kind} finding"
    return match.group(0)


def kill_links(block: str) -> list[dict[str, list[str]]]:
    return [
        parse_qs(urlparse(href.replace("&amp;", "&")).query)
        for href in re.findall(r'href="(/kills/new/\?[^"]+)"', block)
    ]


@pytest.fixture
def requester_page(requester: User) -> str:
    store_busy_host()
    client = Client()
    client.force_login(requester)
    return client.get(reverse("host_detail", args=["gpu01"])).content.decode()


def test_orphans_of_one_launcher_are_one_kill_request_showing_what_it_frees(requester_page: str) -> None:
    block = finding(requester_page, "orphan_gpu")
    assert "Request one kill of all 2 (frees 8 GiB)" in block
    (link,) = kill_links(block)
    assert (link["pid"], link["start"], link["also"]) == (["201"], ["20100"], ["202:20200"])
    assert 'href="/hosts/gpu01/processes/202-20200/"' in block


def test_zombies_offer_their_parent_reap_or_kill_never_the_zombies(requester_page: str) -> None:
    block = re.search(r'data-kind="zombies">(?:(?!</li>).)*leaky-parent.*?</li>', requester_page, re.S).group(
        0
    )
    assert "Parent pid 300 (dave), alive 15 min, holds 5 zombies" in block
    reap, kill = kill_links(block)
    assert (reap["pid"], reap["plan"]) == (["300"], ["reap"])
    assert kill["pid"] == ["300"] and "plan" not in kill
    assert not any(link["pid"][0] in {"301", "302", "303", "304", "305"} for link in kill_links(block))


def test_unattributed_memory_is_never_a_kill(requester_page: str) -> None:
    block = finding(requester_page, "unattributed_memory")
    assert kill_links(block) == []
    assert "no kill" in block


def test_a_d_state_holder_is_not_killable_now(requester: User) -> None:
    store("gpu01", processes=[proc(40, state="D", gpu_memory={"GPU-sim-0000": GiB})], gpus=[gpu(0, used=GiB)])
    client = Client()
    client.force_login(requester)
    block = finding(
        client.get(reverse("host_detail", args=["gpu01"])).content.decode(), "uninterruptible_gpu"
    )
    assert "not killable now" in block
    assert kill_links(block) == []


def test_a_viewer_sees_the_facts_and_links_but_no_kill_buttons(viewer_client: Client) -> None:
    store_busy_host()
    html = viewer_client.get(reverse("host_detail", args=["gpu01"])).content.decode()
    assert kill_links(finding(html, "orphan_gpu")) == []
    assert 'href="/hosts/gpu01/processes/201-20100/"' in finding(html, "orphan_gpu")


def test_the_prefilled_request_form_lists_every_orphan_and_a_reap_plan(requester: User) -> None:
    enrol(store_busy_host())  # requests are filed only for hosts whose key was accepted
    client = Client()
    client.force_login(requester)
    html = client.get(
        reverse("kill_request_new"), {"host": "gpu01", "pid": 201, "start": 20100, "also": "202:20200"}
    ).content.decode()
    targets = re.search(r'<table class="data preview-targets stack">.*?</table>', html, re.S).group(0)
    assert re.findall(r'<tr data-pid="(\d+)"', targets) == ["201", "202"]
    assert "descendant" not in targets  # named beside the first, not below it
    assert 'name="also" value="202:20200"' in html
    reap = client.get(
        reverse("kill_request_new"), {"host": "gpu01", "pid": 300, "start": 30000, "plan": "reap"}
    ).content.decode()
    assert re.search(r'<option value="SIGCHLD" selected>', reap)
