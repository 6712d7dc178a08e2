"""Migration 0008 turns the latest document's jsonb column into text and keeps what was stored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpuadmin.fleet.models import LatestSnapshot
from tests.factories import proc, snapshot
from tests.fleet.helpers import HOSTILE_CMDLINE, T0, at

BEFORE = ("fleet", "0007_process_life_keeps_owner")

# The migration runs outside a test transaction (SQLite rebuilds the table with its foreign keys
# off); serialized_rollback gives later tests back the rows migrations made, which the flush empties.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def before_0008() -> Iterator[MigrationExecutor]:
    """The database as it was before 0008; migrated to the newest state again afterwards."""
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    try:
        yield executor
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_documents_stored_as_json_are_the_same_documents_after_the_migration(
    before_0008: MigrationExecutor,
) -> None:
    old_apps = before_0008.loader.project_state([BEFORE]).apps
    OldHost = old_apps.get_model("fleet", "Host")
    OldLatest = old_apps.get_model("fleet", "LatestSnapshot")
    documents = {
        "gpu01": snapshot("gpu01", processes=[proc(10, cmdline=HOSTILE_CMDLINE)], taken_at=T0),
        "gpu02": snapshot("gpu02", processes=[proc(pid) for pid in range(100, 300)], taken_at=T0),
    }
    for name, document in documents.items():
        host = OldHost.objects.create(name=name, first_seen_at=T0)
        OldLatest.objects.create(host=host, taken_at=T0, received_at=at(1), document=document)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    stored = dict(LatestSnapshot.objects.values_list("host__name", "document"))
    assert stored == documents
