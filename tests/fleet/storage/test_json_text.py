"""The latest document as text (gpuadmin/fleet/storage/json_text.py): read as the document, written as its
text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core import serializers
from django.db import IntegrityError, connection, transaction

from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.fleet.storage.json_text import ValidatedJson
from gpuadmin.fleet.storage.table_settings import server_has_lz4
from tests.factories import proc, snapshot
from tests.fleet.helpers import HOSTILE_CMDLINE, T0, at

pytestmark = pytest.mark.django_db

DOCUMENT: dict[str, Any] = {
    "name": "tr\u00e4iner \U0001f600",
    "hostile": HOSTILE_CMDLINE,
    "numbers": [0, -1, 2**63 - 1, 0.5, 6e-7],
    "nested": {"empty": {}, "none": None, "flags": [True, False], "quote": 'say "hi"\\'},
}


def stored_row(document: Any) -> LatestSnapshot:
    host = Host.objects.create(name="gpu01", first_seen_at=T0)
    return LatestSnapshot.objects.create(host=host, taken_at=T0, received_at=at(1), document=document)


def column_text() -> str:
    """The document column as the database holds it, read past the field."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT document FROM {LatestSnapshot._meta.db_table}")
        (text,) = cursor.fetchone()
    return text


def test_a_document_reads_back_as_the_same_document_however_it_is_read() -> None:
    row = stored_row(DOCUMENT)
    row.refresh_from_db()
    assert row.document == DOCUMENT
    assert LatestSnapshot.objects.get().document == DOCUMENT
    assert LatestSnapshot.objects.document_for(row.host) == DOCUMENT
    assert LatestSnapshot.objects.documents_by_host_id({row.host_id}) == {row.host_id: DOCUMENT}
    assert list(LatestSnapshot.objects.values_list("document", flat=True)) == [DOCUMENT]


def test_a_host_without_a_snapshot_reads_no_document_through_a_join() -> None:
    stored_row(DOCUMENT)
    Host.objects.create(name="gpu02", first_seen_at=T0)
    documents = dict(Host.objects.values_list("name", "latest_snapshot__document"))
    assert documents == {"gpu01": DOCUMENT, "gpu02": None}


def test_a_document_is_encoded_once_compactly() -> None:
    stored_row(DOCUMENT)
    assert column_text() == json.dumps(DOCUMENT, separators=(",", ":"), ensure_ascii=False)


def test_validated_text_is_stored_byte_for_byte() -> None:
    row = stored_row({})
    text = json.dumps(DOCUMENT, indent=2).replace('"flags"', '"flags"   ') + "\n"
    LatestSnapshot.objects.filter(pk=row.pk).update(document=ValidatedJson(text))
    assert column_text() == text
    assert LatestSnapshot.objects.get().document == DOCUMENT


def test_a_plain_string_is_a_json_string_never_taken_for_encoded_text() -> None:
    row = stored_row({})
    hostile = '{"host": {"name": "gpu02"}, "processes": []}'
    LatestSnapshot.objects.filter(pk=row.pk).update(document=hostile)
    assert column_text() == json.dumps(hostile)
    assert LatestSnapshot.objects.get().document == hostile


def test_a_document_that_is_not_strict_json_is_refused() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        stored_row({"utilization": float("nan")})


def test_none_is_no_document_not_the_json_null() -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        stored_row(None)  # the column is NOT NULL: every latest snapshot has its document


def test_dumped_rows_carry_the_document_itself_and_load_back() -> None:
    row = stored_row(DOCUMENT)
    dumped = serializers.serialize("json", LatestSnapshot.objects.all())
    assert json.loads(dumped)[0]["fields"]["document"] == DOCUMENT
    LatestSnapshot.objects.all().delete()
    for loaded in serializers.deserialize("json", dumped):
        loaded.save()
    assert LatestSnapshot.objects.get(pk=row.pk).document == DOCUMENT


def test_the_column_is_text() -> None:
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(cursor, LatestSnapshot._meta.db_table)
    column = next(c for c in columns if c.name == "document")
    assert connection.introspection.get_field_type(column.type_code, column) == "TextField"


@pytest.mark.postgres
def test_on_postgresql_the_column_is_compressed_with_lz4_where_the_server_has_it() -> None:
    # A 200-process snapshot, as central stores thousands of times an hour: well over the
    # size at which PostgreSQL compresses a value.
    stored_row(snapshot("gpu01", processes=[proc(pid, cmdline=["python", f"train-{pid}.py"]) for pid in
                                            range(100, 300)], taken_at=T0))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'document'",
            [LatestSnapshot._meta.db_table],
        )
        (method,) = cursor.fetchone()
        cursor.execute(f"SELECT pg_column_compression(document) FROM {LatestSnapshot._meta.db_table}")
        (compressed_with,) = cursor.fetchone()
    if server_has_lz4(connection):
        assert (method, compressed_with) == ("l", "lz4")
    else:  # the server's default compression, whatever it is
        assert method in ("", "\x00")
