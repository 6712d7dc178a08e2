"""Filter and sort of the holders table, read from query parameters."""

import pytest

from gpuadmin.web.host_tables import ProcessQuery, host_tables
from tests.factories import snapshot
from tests.fleet.helpers import busy_host_gpus, busy_host_processes, store


def test_defaults_when_nothing_is_asked():
    query = ProcessQuery.from_params({})
    assert query == ProcessQuery(user="", gpu="", text="", sort="memory")
    assert query.descending is True
    assert query.query_string() == ""


@pytest.mark.parametrize(("params", "expected"), [
    ({"sort": "pid"}, ProcessQuery(sort="pid")),
    ({"sort": "-age"}, ProcessQuery(sort="-age")),
    ({"sort": "__class__"}, ProcessQuery(sort="memory")),
    ({"sort": "--pid"}, ProcessQuery(sort="memory")),
    ({"gpu": "1"}, ProcessQuery(gpu="1")),
    ({"gpu": "GPU-1"}, ProcessQuery(gpu="")),
    ({"user": "  erin "}, ProcessQuery(user="erin")),
    ({"q": "x" * 500}, ProcessQuery(text="x" * 200)),
    ({"page": "3"}, ProcessQuery(page=3)),
    ({"page": " 2 "}, ProcessQuery(page=2)),
    ({"page": "0"}, ProcessQuery(page=1)),
    ({"page": "-1"}, ProcessQuery(page=1)),
    ({"page": "²"}, ProcessQuery(page=1)),
    ({"page": "9" * 5000}, ProcessQuery(page=10**9)),  # past any table; int() would refuse it
])
def test_parameters_are_read_and_bad_ones_fall_back(params, expected):
    assert ProcessQuery.from_params(params) == expected


@pytest.mark.parametrize(("sort", "descending"), [
    ("memory", True), ("-memory", False), ("pid", False), ("-pid", True),
    ("user", False), ("age", True), ("-age", False),
])
def test_each_key_has_a_natural_order_and_a_minus_reverses_it(sort, descending):
    assert ProcessQuery(sort=sort).descending is descending


def test_sort_links_keep_filters_and_toggle():
    query = ProcessQuery(user="erin", text="rank", sort="pid")
    assert query.sorted_by("pid") == "user=erin&q=rank&sort=-pid"
    assert query.sorted_by("age") == "user=erin&q=rank&sort=age"
    assert query.sorted_by("memory") == "user=erin&q=rank"  # the default needs no parameter


def test_page_links_keep_filter_and_sort_and_a_new_sort_starts_on_page_one():
    query = ProcessQuery(user="erin", sort="pid", page=3)
    assert query.query_string() == "user=erin&sort=pid&page=3"
    assert query.on_page(4) == "user=erin&sort=pid&page=4"
    assert query.on_page(1) == "user=erin&sort=pid"
    assert query.sorted_by("pid") == "user=erin&sort=-pid"


@pytest.mark.django_db
def test_tables_from_a_document():
    host = store("gpu01", processes=busy_host_processes(), gpus=busy_host_gpus())
    gpus = list(host.gpus.order_by("index"))
    tables = host_tables(host.latest_snapshot.document, gpus, ProcessQuery(gpu="0", sort="pid"))
    assert [r.process.pid for r in tables.processes] == [101, 201, 202]
    assert tables.holder_count == 5
    assert (tables.page.number, tables.page.paginator.num_pages, tables.page.paginator.count) == (1, 1, 3)
    assert (tables.page.start_index(), tables.page.end_index()) == (1, 3)
    assert tables.previous_page_link is None and tables.next_page_link is None
    assert tables.users == ["alice", "bob", "carol", "erin"]
    assert tables.zombie_count == 6
    assert [t.parent_pid for t in tables.zombie_trees] == [300, 999]
    assert [r.process.pid for r in tables.orphans] == [201, 202]
    first = tables.processes[0]
    assert first.parent is not None and first.parent.pid == 100
    assert [(m.label, m.memory_bytes) for m in first.gpu_memory] == [("GPU 0", 20 * 1024**3)]


def test_no_document_means_empty_tables():
    tables = host_tables(None, [], ProcessQuery())
    assert tables.has_snapshot is False
    assert tables.processes == tables.zombie_trees == tables.orphans == []
    assert (tables.page.number, tables.page.paginator.count, tables.page.start_index()) == (1, 0, 0)


def test_memory_on_a_gpu_missing_from_the_list_is_labelled_by_uuid():
    document = snapshot(processes=busy_host_processes()[:2], gpus=[])
    document["processes"][1]["gpu_memory_bytes"] = {"GPU-gone": 5}
    tables = host_tables(document, [], ProcessQuery())
    assert [(m.label, m.memory_bytes) for m in tables.processes[0].gpu_memory] == [("GPU-gone", 5)]
