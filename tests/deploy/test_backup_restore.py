"""docs/deploy.md's backup and restore, run on a real PostgreSQL.

The same commands as the doc (createuser, createdb --owner, migrate,
verify_audit, pg_dump --format=custom, rename, pg_restore --no-owner --role),
with the throwaway server's host and port instead of `sudo -u postgres`:
the audit head recorded before the dump verifies after the restore, a head
recorded after the dump is reported missing, and the restored audit table
still refuses DELETE.
"""

from __future__ import annotations

import glob
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from gpuadmin.data_dir import prepare_data_dir
from tests import services

REPO = Path(__file__).resolve().parents[2]


def record_events(count: int) -> str:
    """Code for `manage.py shell -c` that appends ``count`` events to the audit log."""
    return (f"from gpuadmin.audit import log\nfor _ in range({count}): "
            "log.record('requested', host_name='gpu01', requester_name='alice')")


class Central:
    """manage.py and the PostgreSQL client tools against one database of the test server."""

    def __init__(self, server: services.PostgresServer, data_dir: Path) -> None:
        self.server = server
        self.data_dir = data_dir
        prepare_data_dir(data_dir)  # what gpuadmin-manage and the units' ExecStartPre do
        suffix = secrets.token_hex(4)
        self.role = f"gpuadmin_{suffix}"
        self.database = f"gpuadmin_{suffix}"
        self.bin_dirs = glob.glob(services.POSTGRES_BIN_GLOB)

    def client(self, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [services.find_binary(name, self.bin_dirs), "-h", "127.0.0.1", "-p", str(self.server.port),
                "-U", self.server.user, *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check:
            assert result.returncode == 0, f"{name}: {result.stderr}"
        return result

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUADMIN_")}
        environment.update({
            "DATABASE_URL": f"postgresql://{self.role}@127.0.0.1:{self.server.port}/{self.database}",
            "GPUADMIN_DATA_DIR": str(self.data_dir),
            "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
        })
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=environment,
                                capture_output=True, text=True, timeout=300, check=False)
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    def audit_head(self) -> str:
        output = self.manage("verify_audit").stdout
        return next(line.removeprefix("head: ") for line in output.splitlines() if line.startswith("head: "))


@pytest.fixture
def central(postgres_server: services.PostgresServer, tmp_path: Path) -> Central:
    return Central(postgres_server, tmp_path)


def test_a_restored_dump_verifies_against_the_head_recorded_before_it(
    central: Central, tmp_path: Path
) -> None:
    central.client("createuser", central.role)
    central.client("createdb", "--owner", central.role, central.database)
    central.manage("migrate", "--no-input")
    central.manage("shell", "-c", record_events(3))

    # Backup: the head first, then the dump, so the dump holds that event.
    head_at_backup = central.audit_head()
    assert head_at_backup.startswith("3:")
    dump = tmp_path / "gpuadmin.dump"
    central.client("pg_dump", "--format=custom", f"--file={dump}", central.database)
    central.manage("shell", "-c", record_events(2))
    head_after_backup = central.audit_head()
    assert head_after_backup.startswith("5:")

    # Restore into a fresh database, keeping the old one aside.
    central.client("psql", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c",
                   f"ALTER DATABASE {central.database} RENAME TO {central.database}_before_restore")
    central.client("createdb", "--owner", central.role, central.database)
    central.client("pg_restore", f"--dbname={central.database}", "--no-owner", f"--role={central.role}",
                   str(dump))
    assert "No migrations to apply." in central.manage("migrate", "--no-input").stdout

    verified = central.manage("verify_audit", "--anchor", head_at_backup)
    assert "audit chain OK: 3 events" in verified.stdout
    lost = central.manage("verify_audit", "--anchor", head_after_backup, check=False)
    assert lost.returncode != 0
    assert "the anchored event is missing" in lost.stderr

    # The restore brought back the append-only triggers with the table.
    refused = central.client("psql", "-d", central.database, "-v", "ON_ERROR_STOP=1",
                             "-c", "DELETE FROM audit_auditevent", check=False)
    assert refused.returncode != 0
    assert "3:" in central.audit_head()
