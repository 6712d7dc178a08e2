"""python manage.py verify_audit: "audit chain OK: N events" (exit 0), or exit 1 naming the bad event."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from tests.audit.helpers import audit_table, tamper

pytestmark = pytest.mark.django_db


def run_verify(*args: str) -> str:
    out = StringIO()
    call_command("verify_audit", *args, stdout=out)
    return out.getvalue()


def test_an_intact_chain_prints_ok_and_the_head(record_events, anchor_file):
    events = record_events(4)
    output = run_verify()
    assert output.splitlines() == [
        "audit chain OK: 4 events",
        f"no anchors in {anchor_file}: nothing outside the database vouches for this chain",
        f"head: 4:{events[-1].hash}",
    ]


def test_a_row_edited_in_sql_fails_naming_its_sequence(record_events):
    record_events(6)
    tamper(f"UPDATE {audit_table()} SET targets_summary = %s WHERE sequence = 4", ("pid 1 init (root)",))

    with pytest.raises(CommandError, match=r"audit chain BROKEN at event 4: hash mismatch"):
        run_verify()


def test_a_deleted_row_fails_naming_the_gap(record_events):
    record_events(6)
    tamper(f"DELETE FROM {audit_table()} WHERE sequence = 5")

    with pytest.raises(CommandError, match=r"BROKEN at event 5: gap in sequence: event 5 is missing"):
        run_verify()


def test_an_anchor_catches_a_cut_off_tail(record_events):
    events = record_events(5)
    anchor = f"5:{events[-1].hash}"
    assert run_verify("--anchor", anchor).startswith("audit chain OK: 5 events")

    tamper(f"DELETE FROM {audit_table()} WHERE sequence = 5")

    # The remaining chain is consistent; only the anchor shows what is gone.
    assert run_verify().startswith("audit chain OK: 4 events")
    with pytest.raises(CommandError, match=r"BROKEN at event 5: the anchored event is missing"):
        run_verify("--anchor", anchor)


def test_a_malformed_anchor_is_a_clear_error(record_events):
    record_events(1)
    with pytest.raises(CommandError, match="--anchor must be SEQUENCE:HASH"):
        run_verify("--anchor", "5:abc")


def _environment_for_the_test_database() -> dict[str, str]:
    env = dict(os.environ)
    if connection.vendor == "postgresql":
        # Same server, the test database instead of the configured one.
        url = urlsplit(env["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(url._replace(path="/" + connection.settings_dict["NAME"]))
    # On SQLite the test database is the configured file (tests/conftest.py), same GPUADMIN_DATA_DIR.
    return env


def run_verify_process(env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "manage.py", "verify_audit"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


# serialized_rollback: the flush at the end must give later tests back the roles and
# content types that migrations made (and that other serialized tests expect).
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_command_exits_non_zero_from_a_shell(record_events, anchor_file):
    """The real process, as an operator or a cron job runs it, on committed data."""
    record_events(3)
    env = {**_environment_for_the_test_database(), "GPUADMIN_AUDIT_ANCHOR_FILE": str(anchor_file)}
    ok = run_verify_process(env)
    assert (ok.returncode, ok.stdout.splitlines()[0]) == (0, "audit chain OK: 3 events")

    tamper(f"UPDATE {audit_table()} SET actor_name = 'mallory' WHERE sequence = 2")
    broken = run_verify_process(env)
    assert broken.returncode == 1
    assert "audit chain BROKEN at event 2: hash mismatch" in broken.stderr
    assert broken.stdout == ""
