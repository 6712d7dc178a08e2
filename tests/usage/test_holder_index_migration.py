"""Migration 0005 gives every usage cursor stored before it the holders' index the ledger would write."""

from __future__ import annotations

import msgspec
import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpuadmin.fleet import synthetic
from gpuadmin.usage.ledger import Holder, holder_index
from gpuadmin.usage.models import UsageCursor

BEFORE = ("usage", "0004_usage_cursor_lz4")

# Migrating runs outside a test transaction; serialized_rollback gives later tests back the rows
# migrations made, which the flush empties.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def _migrate(target: list[tuple[str, str]] | None = None) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(target or executor.loader.graph.leaf_nodes())


def test_cursors_stored_before_get_the_index_of_their_holders_list() -> None:
    hosts = synthetic.demo_hosts(settings.DATA_DIR, 2, gpus=3, processes=30, prefix="index")
    for host in hosts:
        assert synthetic.send(host, 0)
    written = dict(UsageCursor.objects.values_list("host_id", "holder_index"))
    lists = dict(UsageCursor.objects.values_list("host_id", "holders"))
    assert len(written) == 2
    try:
        _migrate([BEFORE])  # the column goes with its values
    finally:
        _migrate()

    filled = dict(UsageCursor.objects.values_list("host_id", "holder_index"))
    for host_id, text in filled.items():
        holders = msgspec.json.decode(lists[host_id], type=list[Holder])
        assert holders, "the synthetic hosts' processes hold GPUs"
        index = msgspec.json.decode(text)
        expected = msgspec.json.decode(msgspec.json.encode(holder_index(holders)))
        assert index == expected == msgspec.json.decode(written[host_id])
        assert len(index[0]) > 1  # several devices held, each by its place
