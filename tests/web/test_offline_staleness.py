"""An offline host's data is old and says so everywhere (issue 33): its host page's header says as of when,
its findings are kept and marked stale, its GPU bars greyed."""

import re

import pytest
from django.urls import reverse

from tests.fleet.helpers import make_offline, store_busy_host

pytestmark = pytest.mark.django_db


def section_of(client, name: str, element_id: str) -> str:
    page = client.get(reverse("host_detail", kwargs={"name": name})).content.decode()
    return re.search(rf'<section id="{element_id}".*?</section>', page, re.S).group(0)


def summary_of(client, name: str) -> str:
    return section_of(client, name, "host-summary")


def test_an_offline_host_page_says_its_data_is_old_and_keeps_its_findings_marked_stale(viewer_client):
    host = make_offline(store_busy_host("gpu01"))
    summary = summary_of(viewer_client, "gpu01")
    exact = host.last_seen_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert re.search(r'<div class="message message-warning host-stale" role="status">'
                     r"<strong>Offline</strong>: "
                     r"no snapshot for longer than 30 s; data "
                     rf'<time class="moment stale-as-of" datetime="[^"]+" title="{exact}">'
                     r'as of [0-9: -]+ <span class="age">\(2 h ago\)</span></time>', summary)
    # Kept, not "None": one critical, two warnings, two infos, each marked stale.
    assert summary.count('<span class="badge badge-stale"') == 5
    assert section_of(viewer_client, "gpu01", "host-gpus").count("gpu-card-stale") == 2


def test_an_online_host_page_marks_nothing_stale(viewer_client):
    store_busy_host("gpu01")
    summary = summary_of(viewer_client, "gpu01")
    assert "host-stale" not in summary and "badge-stale" not in summary
    assert "gpu-card-stale" not in section_of(viewer_client, "gpu01", "host-gpus")
