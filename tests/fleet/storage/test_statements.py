"""fleet.storage.statements: ingest's fixed statements, their SQL written once, on SQLite and PostgreSQL."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from axes.models import AccessAttempt
from django.db import IntegrityError, connection, transaction
from django.db.models import TextField
from django.db.models.functions import Cast
from django.test.utils import CaptureQueriesContext

from gpuadmin.fleet.models import Finding, Gpu, GpuSample, Host, HostRollup, LatestSnapshot, ProcessLife
from gpuadmin.fleet.storage.json_text import ValidatedJson
from gpuadmin.fleet.storage.statements import (
    AnyOf,
    Param,
    PreparedQuery,
    PreparedUpdate,
    RowInsert,
    RowLookup,
    RowUpdate,
    deferred,
    pipelined,
)
from gpuadmin.usage.models import COUNTER_FIELDS, UsageDay
from tests.fleet.helpers import at, counted_round_trips

pytestmark = pytest.mark.django_db

GPU_FIELDS = ["host", "uuid", "index", "name", "memory_attributed_bytes", "present", "updated_at"]
UPSERT = RowInsert(Gpu, GPU_FIELDS, conflict=["host", "uuid"], update=["index", "name", "updated_at"],
                   returning=["uuid", "id"])


def gpu_row(host: Host, uuid: str, index: int, updated_at: datetime) -> tuple[object, ...]:
    return (host.pk, uuid, index, f"GPU {index}", 0, True, updated_at)


def test_rows_are_stored_as_the_orm_reads_them_back_times_included() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    # A time with no microseconds and one in another zone: both read back as the same instant.
    plus_two = datetime(2026, 12, 2, 14, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    returned = UPSERT.run([gpu_row(host, "GPU-a", 0, at(5)), gpu_row(host, "GPU-b", 1, plus_two)])
    stored = {g.uuid: g for g in Gpu.objects.all()}
    assert {uuid: (g.index, g.name, g.present, g.updated_at) for uuid, g in stored.items()} == {
        "GPU-a": (0, "GPU 0", True, at(5)),
        "GPU-b": (1, "GPU 1", True, datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC)),
    }
    assert returned == [("GPU-a", stored["GPU-a"].pk), ("GPU-b", stored["GPU-b"].pk)]
    samples = RowInsert(GpuSample, ["gpu", "taken_at", "memory_attributed_bytes", "utilization_percent"])
    assert samples.run([(stored["GPU-a"].pk, at(5), 7, None)]) is None  # nothing asked back
    sample = GpuSample.objects.get()
    # memory_used_bytes, nullable, was left out: NULL.
    assert (sample.taken_at, sample.memory_attributed_bytes, sample.memory_used_bytes) == (at(5), 7, None)
    assert GpuSample.objects.filter(taken_at=at(5)).exists()  # stored in the form the ORM queries


def test_an_upsert_updates_the_named_fields_only_and_returns_the_stored_rows_ids() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    UPSERT.run([gpu_row(host, "GPU-a", 0, at(5))])
    first = Gpu.objects.get()
    Gpu.objects.filter(pk=first.pk).update(present=False, idle_since=at(3))
    returned = UPSERT.run([gpu_row(host, "GPU-a", 3, at(10)), gpu_row(host, "GPU-c", 2, at(10))])
    again = Gpu.objects.get(uuid="GPU-a")
    # present is not among the updated fields: the stored value stays, as does idle_since.
    assert (again.pk, again.index, again.updated_at, again.present, again.idle_since) == (
        first.pk, 3, at(10), False, at(3)
    )
    assert returned == [("GPU-a", first.pk), ("GPU-c", Gpu.objects.get(uuid="GPU-c").pk)]


def test_the_sql_is_written_once_per_row_count_and_on_postgresql_once() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    insert = RowInsert(Gpu, GPU_FIELDS)
    with CaptureQueriesContext(connection) as captured:
        insert.run([gpu_row(host, "GPU-a", 0, at(1))])
        insert.run([gpu_row(host, "GPU-b", 1, at(1))])
        insert.run([gpu_row(host, f"GPU-{n}", n, at(1)) for n in (2, 3)])
        insert.run([gpu_row(host, f"GPU-{n}", n, at(1)) for n in (4, 5, 6)])
    # Each statement is in the query log as its text, also when it ran prepared (PostgreSQL).
    sql = [query["sql"] for query in captured]
    assert len(sql) == 4 and all(s.startswith('INSERT INTO "fleet_gpu"') for s in sql)
    if connection.vendor == "postgresql":
        # One row binds its values; more go as one JSON parameter: the same text for any count.
        assert len(insert._sql) == 2 and sql[0] == sql[1] and sql[2] == sql[3] and " VALUES " in sql[0]
    else:
        assert len(insert._sql) == 3 and len({s.split(" VALUES ")[0] for s in sql}) == 1
    assert sorted(Gpu.objects.values_list("uuid", "index")) == [
        *((f"GPU-{n}", n) for n in range(2, 7)), ("GPU-a", 0), ("GPU-b", 1)
    ]


def test_a_database_that_caps_parameters_gets_batches_and_every_id_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    # Two rows of seven fields fit in 15 parameters: five rows take three statements. PostgreSQL's
    # arrays take one parameter per column, whatever the row count: one statement.
    monkeypatch.setattr(type(connection.features), "max_query_params", 15)
    start = at(0)
    rows = [gpu_row(host, f"GPU-{n}", n, start + timedelta(seconds=n)) for n in range(5)]
    with CaptureQueriesContext(connection) as captured:
        returned = UPSERT.run(rows)
    statements = 1 if connection.vendor == "postgresql" else 3
    assert len([q for q in captured.captured_queries if q["sql"].startswith("INSERT")]) == statements
    assert returned == [(g.uuid, g.pk) for g in Gpu.objects.order_by("index")]


def test_without_returned_rows_the_caller_is_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)
    assert UPSERT.run([gpu_row(host, "GPU-a", 0, at(1))]) is None
    assert Gpu.objects.get().uuid == "GPU-a"
    assert UPSERT.run([]) == []


def test_rows_not_asked_back_are_stored_all_the_same() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    assert UPSERT.run([gpu_row(host, "GPU-a", 0, at(1))], returning=False) is None
    two = [gpu_row(host, "GPU-a", 3, at(2)), gpu_row(host, "GPU-b", 1, at(2))]
    assert UPSERT.run(two, returning=False) is None
    assert UPSERT.run([], returning=False) is None
    assert sorted(Gpu.objects.values_list("uuid", "index")) == [("GPU-a", 3), ("GPU-b", 1)]


def test_a_document_kept_as_text_is_written_as_its_field_writes_it() -> None:
    """JsonTextField: validated text as it is, anything else encoded; one row or several."""
    gpu01, gpu02, gpu03 = (Host.objects.create(name=f"gpu0{n}", first_seen_at=at(0)) for n in (1, 2, 3))
    latest = RowInsert(LatestSnapshot, ["host", "taken_at", "received_at", "document"], conflict=["host"],
                       update=["taken_at", "document"])
    text = '{"b": 6e1,  "a": "caf\\u00e9"}'
    latest.run([(gpu01.pk, at(1), at(1), ValidatedJson(text))])
    latest.run([(gpu02.pk, at(1), at(1), {"n": 1}), (gpu03.pk, at(1), at(1), "not validated")])
    stored = dict(LatestSnapshot.objects.values_list("host__name", Cast("document", TextField())))
    assert stored == {"gpu01": text, "gpu02": '{"n":1}', "gpu03": '"not validated"'}
    latest.run([(gpu01.pk, at(2), at(5), {"n": 2})])  # the conflict: replaced, received_at kept
    replaced = LatestSnapshot.objects.filter(host=gpu01).values_list("taken_at", "received_at", "document")
    assert replaced.get() == (at(2), at(1), {"n": 2})


def test_a_conflict_with_nothing_to_update_is_skipped() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    insert_new = RowInsert(Gpu, GPU_FIELDS, conflict=["host", "uuid"])
    insert_new.run([gpu_row(host, "GPU-a", 0, at(1))])
    insert_new.run([gpu_row(host, "GPU-a", 5, at(2))])
    assert list(Gpu.objects.values_list("index", "updated_at")) == [(0, at(1))]


def test_json_values_are_stored_as_their_field_stores_them() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    details = {"cmdline": ["python", "'; DROP TABLE x; --", "caf\u00e9"], "pids": [1, 2], "none": None}
    insert = RowInsert(Finding, ["host", "kind", "key", "severity", "title", "remedy", "details",
                                 "first_seen_at", "last_seen_at"])
    insert.run([(host.pk, "zombies", "k", "warning", "t", "r", details, at(1), at(1)),
                (host.pk, "zombies", "k2", "warning", "t", "r", [], at(1), at(1))])
    assert list(Finding.objects.order_by("key").values_list("details", flat=True)) == [details, []]
    assert Finding.objects.filter(details__pids__1=2).count() == 1  # real JSON, not a string


def test_a_json_column_given_none_is_null_and_a_json_null_inside_a_value_stays() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    life = {"host": host.pk, "boot_id": "boot", "start_time_ticks": 1, "first_seen_at": at(1), "ppid": 1,
            "uid": None, "user": "", "name": "python", "cmdline": ["python"], "container_id": "",
            "description_digest": 0, "last_seen_at": at(1), "gone_at": None, "last_state": "S",
            "last_gpu_memory_bytes": 0, "peak_gpu_memory_bytes": 0, "held_device": False, "was_zombie": False,
            "was_orphaned": False, "point_gpu_memory_bytes": None, "point_state": "S",
            "memory_rising_samples": 0, "memory_rising_since": None, "memory_rising_from_bytes": 0}
    fields = ["pid", "owner", *(name for name in life if name != "owner")]
    insert = RowInsert(ProcessLife, fields)
    owner = {"kind": "slurm_job", "job_id": "42", "step": None}
    insert.run([(pid, value, *(life[name] for name in fields[2:]))
                for pid, value in ((1, None), (2, owner), (3, []))])
    stored = dict(ProcessLife.objects.values_list("pid", "owner"))
    assert stored == {1: None, 2: owner, 3: []}
    # None is SQL NULL, as the ORM stores it, not the JSON null; a null inside a value is JSON's.
    assert list(ProcessLife.objects.filter(owner__isnull=True).values_list("pid", flat=True)) == [1]
    assert list(ProcessLife.objects.filter(owner__step=None).values_list("pid", flat=True)) == [2]


def test_a_float_is_stored_exactly_as_given() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    means = [1 / 3, 2.0**-1074, 1e300, 0.1 + 0.2]
    figures = [f.name for f in HostRollup._meta.fields if f.name.endswith(("_min", "_max", "_mean"))]
    fields = ["host", "bucket", "sample_count", *figures]  # pid_max among them
    rows = [[host.pk, bucket, 1, *(mean if name.endswith("_mean") else 0 for name in fields[3:])]
            for bucket, mean in enumerate(means)]
    RowInsert(HostRollup, fields).run(rows)
    assert list(HostRollup.objects.order_by("bucket").values_list("zombies_mean", flat=True)) == means


def test_an_upsert_adds_the_counters_it_is_told_to_add_and_stores_dates() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    key = ["host", "day", "user", "owner_label", "device_model"]
    add = RowInsert(UsageDay, [*key, "uid", "owner_kind", *COUNTER_FIELDS], conflict=key, update=["uid"],
                    add=COUNTER_FIELDS)
    day = date(2026, 12, 2)
    counters = list(range(1, len(COUNTER_FIELDS) + 1))
    add.run([(host.pk, day, "alice", "", "H100", 1000, "", *counters),
             (host.pk, day, "bob", "", "H100", 1001, "", *counters)])
    add.run([(host.pk, day, "alice", "", "H100", 2000, "", *(10 * n for n in counters))])
    stored = {row[1]: row for row in UsageDay.objects.values_list("day", "user", "uid", *COUNTER_FIELDS)}
    assert stored == {"alice": (day, "alice", 2000, *(11 * n for n in counters)),
                      "bob": (day, "bob", 1001, *counters)}


def test_only_plain_values_are_passed_as_they_are_and_every_required_column_is_set() -> None:
    with pytest.raises(TypeError, match=r"ip_address \(GenericIPAddressField\)"):
        RowInsert(AccessAttempt, ["ip_address"])
    with pytest.raises(TypeError, match=r"fleet\.Gpu must set memory_attributed_bytes, present, updated_at"):
        RowInsert(Gpu, ["host", "uuid", "index", "name"])
    with pytest.raises(TypeError, match=r"fleet\.Host\.gpus is not a column"):
        RowInsert(Host, ["gpus"])


# --- PreparedQuery, PreparedUpdate ---------------------------------------------------------

FINDINGS = PreparedQuery(
    Finding.objects.filter(host=Param(Finding, "host"), last_seen_at__gte=Param(Finding, "last_seen_at",
                                                                                 key="since"))
    .order_by("key")
    .values_list("key", "details", "last_seen_at", "resolved_at")
)
SEEN = PreparedUpdate(Finding.objects.filter(host=Param(Finding, "host"), resolved_at=None),
                      last_seen_at=Param(Finding, "last_seen_at"), title="seen")


def finding(host: Host, key: str, seen_seconds: float, **fields: object) -> Finding:
    return Finding.objects.create(host=host, kind=Finding.Kind.ZOMBIES, key=key, severity="info", title="t",
                                  remedy="r", details={"pids": [1, 2], "key": key},
                                  first_seen_at=at(0), last_seen_at=at(seen_seconds), **fields)


def test_a_prepared_query_reads_what_the_queryset_would_with_each_runs_values() -> None:
    gpu01, gpu02 = (Host.objects.create(name=name, first_seen_at=at(0)) for name in ("gpu01", "gpu02"))
    finding(gpu01, "a", 5)
    finding(gpu01, "b", 10, resolved_at=at(11))
    finding(gpu02, "c", 10)
    expected = list(Finding.objects.filter(host=gpu01, last_seen_at__gte=at(5)).order_by("key")
                    .values_list("key", "details", "last_seen_at", "resolved_at"))
    # Times, JSON and NULL come back converted as the ORM gives them.
    assert FINDINGS.rows(host=gpu01.pk, since=at(5)) == expected == [
        ("a", {"pids": [1, 2], "key": "a"}, at(5), None),
        ("b", {"pids": [1, 2], "key": "b"}, at(10), at(11)),
    ]
    # In the zone the ORM gives them in (on PostgreSQL read by psycopg's own loader, not Django's).
    prepared = FINDINGS.rows(host=gpu01.pk, since=at(5))
    assert {row[2].tzinfo for row in expected} == {row[2].tzinfo for row in prepared} == {UTC}
    with CaptureQueriesContext(connection) as captured:
        assert FINDINGS.rows(host=gpu01.pk, since=at(6)) == [expected[1]]
        other_host = FINDINGS.rows(host=gpu02.pk, since=at(0))
        assert other_host == [("c", {"pids": [1, 2], "key": "c"}, at(10), None)]
        assert FINDINGS.rows(host=gpu02.pk + 100, since=at(0)) == []
    # Compiled once: the same SQL, only the values differ.
    assert len({q["sql"].split(" WHERE ")[0] for q in captured.captured_queries}) == 1
    assert len(FINDINGS._compiled) == 1


GPU_COLUMNS = ("pk", "uuid", "index", "memory_total_bytes", "memory_used_bytes", "utilization_percent",
               "present", "idle_since", "updated_at")
BINARY_GPUS = PreparedQuery(
    Gpu.objects.filter(host=Param(Gpu, "host")).order_by("index").values_list(*GPU_COLUMNS), binary=True
)


def test_a_binary_prepared_query_reads_the_same_values_as_the_orm() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    Gpu.objects.create(host=host, index=0, uuid="GPU-0", memory_total_bytes=2**62, memory_used_bytes=-(2**40),
                       utilization_percent=0, present=False, idle_since=at(3) + timedelta(microseconds=7),
                       updated_at=at(4))
    Gpu.objects.create(host=host, index=1, uuid="GPU-é", memory_total_bytes=None, memory_used_bytes=0,
                       utilization_percent=None, present=True, idle_since=None, updated_at=at(5))
    expected = list(Gpu.objects.filter(host=host).order_by("index").values_list(*GPU_COLUMNS))
    rows = BINARY_GPUS.rows(host=host.pk)
    assert rows == expected and [type(v) for v in rows[0]] == [type(v) for v in expected[0]]
    assert rows[0][7].tzinfo == UTC  # an aware time in UTC, as the ORM gives it
    assert BINARY_GPUS.rows(host=host.pk + 1) == []


@pytest.mark.postgres
def test_on_postgresql_the_binary_query_s_rows_come_in_binary_and_others_in_text() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    Gpu.objects.create(host=host, index=0, uuid="GPU-0")
    finding(host, "a", 5)
    formats = {}
    for name, query, values in [("binary", BINARY_GPUS, {"host": host.pk}),
                                ("text", FINDINGS, {"host": host.pk, "since": at(0)})]:
        pending = query.start(**values)
        try:
            result = pending._cursor.cursor.pgresult  # the server's answer, as libpq holds it
            formats[name] = {result.fformat(n) for n in range(result.nfields)}
        finally:
            pending.close()
    assert formats == {"binary": {1}, "text": {0}}


def test_a_binary_prepared_query_of_a_json_column_is_refused() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    details = PreparedQuery(Finding.objects.filter(host=Param(Finding, "host")).values_list("key", "details"),
                            binary=True)
    with pytest.raises(TypeError, match="integers, booleans, text and times only"):
        details.rows(host=host.pk)


def test_a_prepared_update_sets_its_fields_on_the_rows_its_values_pick() -> None:
    gpu01, gpu02 = (Host.objects.create(name=name, first_seen_at=at(0)) for name in ("gpu01", "gpu02"))
    finding(gpu01, "a", 5)
    finding(gpu01, "b", 5, resolved_at=at(6))
    finding(gpu02, "c", 5)
    SEEN.run(host=gpu01.pk, last_seen_at=at(20))
    assert sorted(Finding.objects.values_list("key", "last_seen_at", "title")) == [
        ("a", at(20), "seen"), ("b", at(5), "t"), ("c", at(5), "t")
    ]
    SEEN.run(host=gpu02.pk, last_seen_at=at(30))
    assert Finding.objects.get(key="c").last_seen_at == at(30)
    assert Finding.objects.filter(last_seen_at=at(30)).count() == 1  # stored in the form the ORM queries


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_on_postgresql_each_fixed_statement_is_prepared_once_per_connection() -> None:
    # A new connection: none of the statements earlier tests prepared (psycopg lets go of those
    # when a test's transaction is rolled back, and the server later).
    connection.close()
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    for n in range(3):
        UPSERT.run([gpu_row(host, f"GPU-{n}", n, at(n))])
        FINDINGS.rows(host=host.pk, since=at(0))
        SEEN.run(host=host.pk, last_seen_at=at(n))
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert [s.split(None, 3)[:3] for s in prepared if "fleet_" in s] == [
        ["INSERT", "INTO", '"fleet_gpu"'], ["SELECT", '"fleet_finding"."key"', "AS"],
        ["UPDATE", '"fleet_finding"', "SET"],
    ]
    # The values were bound, not written into the statements.
    assert not any("gpu01" in s or "GPU-1" in s for s in prepared)
    assert sorted(Gpu.objects.values_list("uuid", flat=True)) == ["GPU-0", "GPU-1", "GPU-2"]


def _pipeline_on() -> bool:
    return connection.vendor == "postgresql" and connection.connection.pgconn.pipeline_status != 0


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_pipelined_writes_are_all_done_when_read_and_at_the_end() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    finding(host, "a", 5)
    with pipelined():
        assert not _pipeline_on()  # outside a transaction: one by one, as always
    with transaction.atomic(), pipelined():
        assert _pipeline_on() == (connection.vendor == "postgresql")
        UPSERT.run([gpu_row(host, "GPU-a", 0, at(1))], returning=False)
        SEEN.run(host=host.pk, last_seen_at=at(20))
        # A read waits for every write sent before it.
        assert FINDINGS.rows(host=host.pk, since=at(20)) == [("a", {"pids": [1, 2], "key": "a"}, at(20),
                                                              None)]
        UPSERT.run([gpu_row(host, "GPU-b", 1, at(1))], returning=False)
    assert not _pipeline_on()
    assert sorted(Gpu.objects.values_list("uuid", flat=True)) == ["GPU-a", "GPU-b"]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_pipelined_write_that_fails_fails_the_transaction_with_djangos_error() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    finding(host, "a", 5)
    plain = RowInsert(Gpu, GPU_FIELDS)  # no conflict clause: a second GPU-a breaks the unique constraint
    plain.run([gpu_row(host, "GPU-a", 0, at(1))])
    with pytest.raises(IntegrityError), transaction.atomic(), pipelined():
        SEEN.run(host=host.pk, last_seen_at=at(20))
        plain.run([gpu_row(host, "GPU-a", 1, at(2))])
        UPSERT.run([gpu_row(host, "GPU-b", 1, at(2))], returning=False)
    # Nothing of the transaction stayed, the write before the failing one included.
    assert Finding.objects.get().last_seen_at == at(5)
    assert list(Gpu.objects.values_list("uuid", "index")) == [("GPU-a", 0)]
    assert not _pipeline_on()
    SEEN.run(host=host.pk, last_seen_at=at(30))  # the connection works on
    assert Finding.objects.get().last_seen_at == at(30)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize("piped", [False, True], ids=["one by one", "pipelined"])
def test_a_started_query_reads_the_rows_as_they_were_when_it_was_sent(piped: bool) -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    finding(host, "a", 5)
    with transaction.atomic(), (pipelined() if piped else nullcontext()):
        pending = FINDINGS.start(host=host.pk, since=at(0))
        SEEN.run(host=host.pk, last_seen_at=at(20))  # a write sent after it
        if not piped:  # (no save() inside a pipeline: its row count is not known yet)
            finding(host, "b", 7)
        after = FINDINGS.start(host=host.pk, since=at(0))
    assert pending.rows() == [("a", {"pids": [1, 2], "key": "a"}, at(5), None)]
    assert [key for key, *_ in after.rows()] == (["a"] if piped else ["a", "b"])
    with pytest.raises(RuntimeError, match="read already"):
        pending.rows()
    given_up = FINDINGS.start(host=host.pk, since=at(0))
    given_up.close()
    with pytest.raises(RuntimeError, match="given up"):
        given_up.rows()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_reads_started_inside_a_pipeline_come_back_in_one_round_trip() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=at(0))
    finding(host, "a", 5)
    with transaction.atomic():
        FINDINGS.rows(host=host.pk, since=at(0))  # the transaction begun, the statement prepared
        with counted_round_trips() as one_by_one:
            read = [FINDINGS.rows(host=host.pk, since=at(0)) for _ in range(3)]
        with counted_round_trips() as started:
            with pipelined():
                pending = [FINDINGS.start(host=host.pk, since=at(0)) for _ in range(3)]
            started_rows = [p.rows() for p in pending]
    assert started_rows == read and len(read[0]) == 1
    assert (one_by_one, started) == ([3], [1])


LATEST_UPDATE = RowUpdate(LatestSnapshot, "host", ["taken_at", "update_sequence", "update"], deferrable=True)
HOST_PIDS = RowUpdate(Host, "id", ["pids_in_use"])  # not deferrable
HOSTS_NAMED = PreparedQuery(Host.objects.filter(AnyOf(Host, "name", key="names")).order_by("pk")
                            .values_list("name"))


def test_a_row_update_sets_each_row_its_own_values_times_and_documents_included() -> None:
    hosts = [Host.objects.create(name=f"gpu{n:02}", first_seen_at=at(0)) for n in range(3)]
    for host in hosts:
        LatestSnapshot.objects.create(host=host, taken_at=at(0), received_at=at(0), document={"n": 0})
    LATEST_UPDATE.run([(hosts[0].pk, at(10), 1, ValidatedJson('{"a":1}')),
                       (hosts[2].pk, at(20), 7, None),
                       (10**9, at(30), 9, None)])  # no such host: sets nothing
    stored = {latest.host.name: (latest.taken_at, latest.update_sequence, latest.update)
              for latest in LatestSnapshot.objects.select_related("host")}
    assert stored == {"gpu00": (at(10), 1, {"a": 1}), "gpu01": (at(0), 0, None), "gpu02": (at(20), 7, None)}
    assert LatestSnapshot.objects.filter(taken_at=at(20)).count() == 1  # stored in the form the ORM queries


def test_any_of_takes_a_list_of_any_length_in_one_statement() -> None:
    for name in ("gpu01", "gpu02", "gpu03"):
        Host.objects.create(name=name, first_seen_at=at(0))
    with CaptureQueriesContext(connection) as queries:
        assert HOSTS_NAMED.rows(names=["gpu03", "gpu01", "nope"]) == [("gpu01",), ("gpu03",)]
        assert HOSTS_NAMED.rows(names=["gpu02"]) == [("gpu02",)]
        assert HOSTS_NAMED.rows(names=[]) == []
    assert len({query["sql"].split(" WHERE ")[0] for query in queries}) == 1
    assert all("gpu0" not in query["sql"].split(" WHERE ")[1].split("(")[0] for query in queries)


def test_deferred_rows_are_written_by_one_statement_each_at_the_end_and_not_at_all_on_an_error() -> None:
    hosts = [Host.objects.create(name=f"gpu{n:02}", first_seen_at=at(0)) for n in range(2)]
    for host in hosts:
        LatestSnapshot.objects.create(host=host, taken_at=at(0), received_at=at(0), document={"n": 0})
    with CaptureQueriesContext(connection) as queries, deferred():
        for n, host in enumerate(hosts):
            LATEST_UPDATE.run([(host.pk, at(10 + n), n + 1, None)])
            HOST_PIDS.run([(host.pk, 100 + n)])  # not deferrable: at once
        assert LatestSnapshot.objects.filter(update_sequence__gt=0).count() == 0  # not yet
        assert sorted(Host.objects.values_list("pids_in_use", flat=True)) == [100, 101]
    assert sorted(LatestSnapshot.objects.values_list("update_sequence", flat=True)) == [1, 2]
    assert len([q for q in queries if 'UPDATE "fleet_latestsnapshot"' in q["sql"]]) == 1
    with pytest.raises(RuntimeError, match="nest"), deferred(), deferred():
        pass
    with pytest.raises(ZeroDivisionError), deferred():
        LATEST_UPDATE.run([(hosts[0].pk, at(50), 9, None)])
        _ = 1 / 0
    assert not LatestSnapshot.objects.filter(update_sequence=9).exists()
    LATEST_UPDATE.run([(hosts[0].pk, at(60), 3, None)])  # outside a block: at once
    assert LatestSnapshot.objects.filter(update_sequence=3).exists()


LIVES_BY_IDENTITY = RowLookup(ProcessLife, ["host", "boot_id", "pid", "start_time_ticks"],
                              ["host", "pid", "user", "held_device"], null=["gone_at"])


def test_a_row_lookup_reads_each_key_s_row_and_no_other_in_one_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hosts = [Host.objects.create(name=f"gpu{n:02}", first_seen_at=at(0)) for n in range(2)]
    for host in hosts:
        for pid in (10, 11, 12):
            ProcessLife.objects.create(host=host, boot_id="b", pid=pid, start_time_ticks=pid * 7,
                                       user=f"u{pid}", held_device=pid == 11, first_seen_at=at(0),
                                       last_seen_at=at(0), gone_at=at(5) if pid == 12 else None)
    a, b = (host.pk for host in hosts)
    # Two fields of four keys: two keys a statement on SQLite; one JSON parameter on PostgreSQL.
    monkeypatch.setattr(type(connection.features), "max_query_params", 9)
    keys = [(a, "b", 10, 70), (b, "b", 11, 77),
            (a, "b", 12, 84),  # gone: not read
            (a, "other boot", 11, 77), (a, "b", 11, 78), (b + 100, "b", 10, 70)]  # no such life
    with CaptureQueriesContext(connection) as captured:
        found = LIVES_BY_IDENTITY.rows(keys)
    assert sorted(found) == [(a, 10, "u10", False), (b, 11, "u11", True)]
    assert len(captured.captured_queries) == (1 if connection.vendor == "postgresql" else 3)
    assert LIVES_BY_IDENTITY.rows([]) == []


def test_a_row_lookup_of_a_time_or_json_column_is_refused() -> None:
    for column in ("first_seen_at", "owner"):
        with pytest.raises(TypeError, match=column):
            RowLookup(ProcessLife, ["host", "pid"], ["pid", column])
