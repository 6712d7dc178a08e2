"""The usage page, its CSV (exactly the table) and the API, over a ledger written by the real ingest."""

from __future__ import annotations

import csv
import io
from html.parser import HTMLParser

import pytest
from django.urls import reverse

from gpuadmin.notify.models import Account, Person
from gpuadmin.usage.views import spreadsheet_safe
from tests.factories import GiB, gpu, proc, snapshot
from tests.fleet.helpers import at
from tests.keys import deliver
from tests.usage.test_ledger import timeline

pytestmark = pytest.mark.django_db

DAY = "from=2026-12-02&to=2026-12-02"


@pytest.fixture
def ledger(settings) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    timeline()


class TableCells(HTMLParser):
    """The cells of the page's usage table, row by row (the last column, its links, left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.inside = False
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("class", "data usage-table") in attrs:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("th", "td"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("th", "td") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def page_table(client, query: str) -> list[list[str]]:
    response = client.get(f"{reverse('usage')}?{query}")
    assert response.status_code == 200
    parser = TableCells()
    parser.feed(response.content.decode())
    return [row[:-1] for row in parser.rows]


def test_the_csv_is_exactly_the_table(ledger, viewer_client) -> None:
    for by in ("user", "person", "owner", "host", "gpu_model"):
        for sort in ("held", "idle"):
            query = f"{DAY}&by={by}&sort={sort}"
            response = viewer_client.get(f"{reverse('usage_csv')}?{query}")
            assert response["Content-Type"].startswith("text/csv")
            exported = list(csv.reader(io.StringIO(response.content.decode())))
            shown = page_table(viewer_client, query)
            assert exported == shown, (by, sort)
            assert len(shown) > 2  # a header and rows


def test_the_table_says_the_hours_sorted_as_asked(ledger, viewer_client) -> None:
    by_held = page_table(viewer_client, f"{DAY}&by=user")
    assert by_held[0] == ["Unix user", "GPU-hours", "GiB-hours", "Busy GPU-hours", "Idle GPU-hours",
                          "Unmeasured GPU-hours", "Estimated busy GPU-hours"]
    # bob: 40 s on GPU0 and 40 s on GPU1 = 80 s; alice 60 s; carol 20 s; dave 10 s.
    assert [(r[0], r[1]) for r in by_held[1:]] == [("bob", "0.02"), ("alice", "0.02"), ("carol", "0.01"),
                                                   ("dave", "0.00")]
    by_idle = page_table(viewer_client, f"{DAY}&by=user&sort=idle")
    assert [r[0] for r in by_idle[1:]] == ["bob", "alice", "carol", "dave"]  # 70 s, 30 s, then 0 by name
    empty = viewer_client.get(f"{reverse('usage')}?from=2026-12-03&to=2026-12-04").content.decode()
    assert "No GPU was held in this period." in empty


def test_measured_busy_time_is_told_apart_from_the_estimate_in_the_api_the_page_and_the_csv(
        settings, viewer_client) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    measured = proc(100, gpu_memory={"GPU-sim-0000": GiB}, reasons=["gpu"],
                    gpu_utilization_percent={"GPU-sim-0000": 36})
    guessed = proc(200, user="bob", gpu_memory={"GPU-sim-0000": GiB}, reasons=["gpu"])
    for seconds in (0, 10):
        deliver(snapshot("gpu-a", processes=[measured, guessed], taken_at=at(seconds),
                         gpus=[gpu(0, utilization_percent=72)]), received_at=at(seconds + 1))
    answer = viewer_client.get(f"/api/v1/usage/?{DAY}&by=user").json()
    assert answer["busy_is_estimate"] is False
    rows = {r["key"]: r for r in answer["rows"]}
    # alice's own 36 % of 10 s; bob the 36 % she left: the same hours, his estimated.
    assert (rows["alice"]["busy_gpu_hours"], rows["alice"]["busy_estimated_gpu_hours"]) == (
        pytest.approx(3.6 / 3600), 0)
    bob = rows["bob"]
    assert bob["busy_estimated_gpu_hours"] == bob["busy_gpu_hours"] == pytest.approx(3.6 / 3600)
    exported = viewer_client.get(f"{reverse('usage_csv')}?{DAY}").content.decode()
    csv_rows = list(csv.reader(io.StringIO(exported)))
    assert csv_rows[0][-1] == "Estimated busy GPU-hours"
    assert csv_rows == page_table(viewer_client, DAY)


def test_the_api_filters_by_period_and_groups(ledger, viewer_client) -> None:
    answer = viewer_client.get(f"/api/v1/usage/?{DAY}&by=host").json()
    assert answer["busy_is_estimate"] is True
    assert answer["days"] == ["2026-12-02"]
    rows = {r["key"]: r for r in answer["rows"]}
    assert set(rows) == {"gpu-a", "gpu-b"}
    assert rows["gpu-a"]["held_gpu_hours"] == pytest.approx(140 / 3600)
    assert rows["gpu-a"]["idle_gpu_hours"] == pytest.approx(100 / 3600)
    assert rows["gpu-a"]["busy_gpu_hours"] == pytest.approx(16 / 3600)
    assert rows["gpu-a"]["busy_estimated_gpu_hours"] == pytest.approx(16 / 3600)
    assert rows["gpu-b"]["unmeasured_gpu_hours"] == pytest.approx(30 / 3600)
    assert rows["gpu-a"]["held_gpu_hours_per_day"] == [pytest.approx(140 / 3600)]
    models = {r["key"] for r in viewer_client.get(f"/api/v1/usage/?{DAY}&by=gpu_model").json()["rows"]}
    assert models == {"Sim H100", "Sim A100 MIG 3g.20gb", "Sim A100 MIG 1g.5gb"}
    by_owner = viewer_client.get(f"/api/v1/usage/?{DAY}&by=owner").json()["rows"]
    owners = {r["key"]: r["label"] for r in by_owner}
    assert owners == {"job 77.0": "job 77.0", "": "(no owner)"}
    assert viewer_client.get("/api/v1/usage/?from=2026-12-03&to=2026-12-09").json()["rows"] == []
    week = viewer_client.get("/api/v1/usage/?to=2026-12-02").json()
    assert (week["start"], len(week["days"]), len(week["rows"])) == ("2026-11-26", 7, 4)


@pytest.mark.parametrize("query", ["from=yesterday", "from=2026-12-03&to=2026-12-02", "by=group",
                                   "sort=fast", "from=2020-01-01&to=2026-12-02"])
def test_the_api_refuses_what_it_cannot_read_and_says_why(viewer_client, query) -> None:
    response = viewer_client.get(f"/api/v1/usage/?{query}")
    assert response.status_code == 400
    assert response.json()["detail"]
    assert viewer_client.get(f"{reverse('usage')}?{query}").status_code == 400


def test_people_are_resolved_when_read_a_slurm_account_for_a_job(ledger, viewer_client) -> None:
    alice = Person.objects.create(name="Alice Archer")
    Account.objects.create(person=alice, name="alice")
    bob = Person.objects.create(name="Bob Baker")
    Account.objects.create(person=bob, kind=Account.Kind.SLURM, uid=1001)
    rows = {r["label"]: r["held_gpu_hours"] for r in
            viewer_client.get(f"/api/v1/usage/?{DAY}&by=person").json()["rows"]}
    assert rows == {"Alice Archer": pytest.approx(60 / 3600), "Bob Baker": pytest.approx(80 / 3600),
                    "carol (not mapped to a person)": pytest.approx(20 / 3600),
                    "dave (not mapped to a person)": pytest.approx(10 / 3600)}


def test_a_row_links_to_the_processes_behind_it(ledger, viewer_client) -> None:
    response = viewer_client.get(f"{reverse('usage_processes')}?{DAY}&by=user&key=bob")
    text = response.content.decode()
    assert response.status_code == 200
    assert reverse("process_detail", args=["gpu-a", 200, 20000]) in text
    assert reverse("process_detail", args=["gpu-a", 100, 10000]) not in text
    assert text.count("<tr>") == 3  # the header, GPU0 and GPU1
    nobody = viewer_client.get(f"{reverse('usage_processes')}?{DAY}&by=user&key=zed").content.decode()
    assert "None." in nobody


def test_a_name_that_would_be_a_formula_stays_text_in_the_csv(settings, viewer_client) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    for seconds in (0, 10):
        deliver(snapshot("gpu-a", taken_at=at(seconds), gpus=[gpu(0, utilization_percent=0)],
                         processes=[proc(100, user="=HYPERLINK(\"x\")", gpu_memory={"GPU-sim-0000": GiB})]),
                received_at=at(seconds + 1))
    exported = viewer_client.get(f"{reverse('usage_csv')}?{DAY}").content.decode()
    assert list(csv.reader(io.StringIO(exported)))[1][0] == "'=HYPERLINK(\"x\")"
    assert spreadsheet_safe("alice") == "alice"


def test_the_usage_pages_need_a_viewer(client, stranger) -> None:
    from tests.people import client_for

    assert client.get(reverse("usage")).status_code == 302
    assert client_for(stranger).get(reverse("usage_csv")).status_code == 403
    assert client.get("/api/v1/usage/").status_code == 401
