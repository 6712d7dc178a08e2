"""Pages read from a real PostgreSQL streaming replica, the kill path and every write from the primary.

The test starts a primary and a hot standby (tests/services.py, pg_basebackup -R) and runs the panel
against them in a subprocess (settings are read once, from the environment, as gunicorn reads them):
DATABASE_URL names the primary, GPUADMIN_DATABASE_REPLICA_URL the standby. The standby's replay is
paused, so what the primary writes afterwards is on the primary only: a page that shows it read the
primary, a page that does not read the replica.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuadmin import db_router
from tests import services

REPO = Path(__file__).resolve().parents[1]

PANEL = r"""
import json, time
import django
django.setup()
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

call_command("migrate", verbosity=0)
from gpuadmin.accounts.roles import Role
from gpuadmin.fleet.models import Host
from gpuadmin.kills.models import KillRequest
from tests.kills.helpers import lab_snapshot, store_snapshot
from tests.people import client_for, make_person

primary, replica = connections["default"], connections["replica"]


def standby_sql(sql):
    with replica.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0] if cursor.description else None


def caught_up():
    with primary.cursor() as cursor:
        # The insert position, not the write position: with synchronous_commit off (tests/services.py)
        # a commit record can still sit in the WAL buffers, behind pg_current_wal_lsn().
        cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
        target = cursor.fetchone()[0]
    deadline = time.monotonic() + 20
    while not standby_sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"):
        assert time.monotonic() < deadline, "the standby did not catch up"
        time.sleep(0.05)


def tables(context):
    return sorted({q["sql"].split(" FROM ", 1)[1].split()[0].strip('"') for q in context.captured_queries
                   if q["sql"].startswith("SELECT") and " FROM " in q["sql"]})


viewer = make_person("vera", Role.VIEWER)
requester = make_person("rick", Role.REQUESTER)
Host.objects.create(name="early")
caught_up()
standby_sql("SELECT pg_wal_replay_pause()")
store_snapshot(lab_snapshot())  # gpu01, on the primary only from here
out = {"in_recovery": standby_sql("SELECT pg_is_in_recovery()")}
client = client_for(viewer)
with CaptureQueriesContext(primary) as on_primary, CaptureQueriesContext(replica) as on_replica:
    listed = client.get("/api/v1/hosts/")
out["api_hosts"] = [listed.status_code, sorted(h["name"] for h in listed.json())]
out["api_hosts_primary_tables"], out["api_hosts_replica_tables"] = tables(on_primary), tables(on_replica)
out["host_page"] = client.get("/hosts/gpu01/").status_code
filed = client_for(requester).post("/kills/new/", {
    "host": "gpu01", "pid": 4120, "start": 412000, "signal_1": "SIGTERM", "grace_1": 5,
    "reason": "filed while the standby lags"})
out["kill_filed"] = [filed.status_code, KillRequest.objects.count()]
out["kill_page"] = client.get(filed["Location"]).status_code if filed.status_code == 302 else None
standby_sql("SELECT pg_wal_replay_resume()")
caught_up()
out["api_hosts_after_replay"] = sorted(h["name"] for h in client.get("/api/v1/hosts/").json())
# Every page on the replica's list renders with reads on both sides (gpu01 has an open kill request).
out["pages"] = {url: client.get(url).status_code for url in (
    "/", "/hosts/gpu01/", "/hosts/gpu01/processes/4120-412000/", "/usage/", "/usage/processes/",
    "/api/v1/hosts/gpu01/", "/api/v1/hosts/gpu01/history/", "/api/v1/usage/")}
print("RESULT " + json.dumps(out))
"""


def run_panel(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("DATABASE_URL", "REDIS_URL", "GPUADMIN_DATABASE_REPLICA_URL")}
    environment.update({"DJANGO_SETTINGS_MODULE": "gpuadmin.settings", "GPUADMIN_DATA_DIR": str(tmp_path),
                        **env})
    subprocess.run([sys.executable, "-m", "gpuadmin.data_dir"], env=environment, cwd=REPO, check=True,
                   capture_output=True)
    return subprocess.run([sys.executable, "-c", script], env=environment, cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.services
def test_pages_read_the_replica_while_the_kill_path_and_writes_use_the_primary(tmp_path: Path) -> None:
    try:
        servers = services.postgres_with_standby()
        primary, standby = servers.__enter__()
    except services.ServiceMissing as exc:
        services.missing(str(exc))
    try:
        ran = run_panel(tmp_path, PANEL, DATABASE_URL=primary.url, GPUADMIN_DATABASE_REPLICA_URL=standby.url)
    finally:
        servers.__exit__(None, None, None)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
    out = json.loads(ran.stdout.split("RESULT ", 1)[1])
    assert out["in_recovery"] is True
    # The host list came from the paused standby: gpu01, written after the pause, is not in it yet...
    assert out["api_hosts"] == [200, ["early"]]
    assert out["host_page"] == 404
    # ... and only the fleet's tables were read there; who is asking was read on the primary.
    replica_tables = out["api_hosts_replica_tables"]
    assert replica_tables and all(table.startswith("fleet_") for table in replica_tables)
    assert "django_session" in out["api_hosts_primary_tables"]
    assert "auth_user" in out["api_hosts_primary_tables"]
    assert not any(t.startswith("fleet_") for t in out["api_hosts_primary_tables"])
    # Filing a kill read gpu01's snapshot and wrote the request on the primary, and its page reads it there.
    assert out["kill_filed"] == [302, 1]
    assert out["kill_page"] == 200
    assert out["api_hosts_after_replay"] == ["early", "gpu01"]
    assert set(out["pages"].values()) == {200}, out["pages"]


def test_the_router_sends_reads_to_the_replica_only_for_fleet_and_usage_during_a_marked_page() -> None:
    from django.contrib.auth.models import User
    from django.contrib.sessions.models import Session

    from gpuadmin.audit.models import AuditEvent
    from gpuadmin.fleet.models import Host
    from gpuadmin.kills.models import KillRequest

    router = db_router.ReplicaRouter()
    assert router.db_for_read(Host) == "default"  # no page marked: the primary
    token = db_router._replica_reads.set(True)
    try:
        assert router.db_for_read(Host) == "replica"
        for model in (User, Session, KillRequest, AuditEvent):
            assert router.db_for_read(model) == "default", model
        assert router.db_for_write(Host) == "default"
        # After a write, this request reads the primary: it sees what it wrote.
        assert router.db_for_read(Host) == "default"
    finally:
        db_router._replica_reads.reset(token)
    assert router.allow_migrate("replica", "fleet") is False
    assert router.allow_migrate("default", "fleet") is None


# Outside the test's own transaction, so that atomic() opens the first one; the rows migrations made
# come back after the flush (serialized_rollback), for the tests that come next.
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_read_inside_a_transaction_stays_on_the_primary() -> None:
    from django.db import transaction

    from gpuadmin.fleet.models import Host

    router = db_router.ReplicaRouter()
    token = db_router._replica_reads.set(True)
    try:
        with transaction.atomic():
            assert router.db_for_read(Host) == "default"
        assert router.db_for_read(Host) == "replica"
    finally:
        db_router._replica_reads.reset(token)


def test_a_replica_without_a_primary_url_is_refused(tmp_path: Path) -> None:
    ran = run_panel(tmp_path, "import django; django.setup()",
                    GPUADMIN_DATABASE_REPLICA_URL="postgresql://x@127.0.0.1:1/gpuadmin")
    assert ran.returncode != 0
    assert "GPUADMIN_DATABASE_REPLICA_URL needs DATABASE_URL" in ran.stderr
