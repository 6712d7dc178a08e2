"""Run the database tests again on a throwaway PostgreSQL: python tests/with_postgres.py [pytest args].

Starts PostgreSQL (initdb + pg_ctl in a temp dir, free port), points
DATABASE_URL at it, runs `python -m pytest` (default: `-m engine`, the tests
whose outcome depends on the database engine, the `postgres`-marked ones
among them: tests/conftest.py says which; `--db-only` gives every test that
uses the database), stops PostgreSQL and exits with pytest's status.

PostgreSQL not installed: exit 0 with a note, or 1 when GPUADMIN_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import services  # noqa: E402 (needs the repository on sys.path first)

NO_TESTS_COLLECTED = 5


def main(argv: list[str]) -> int:
    pytest_args = argv or ["-m", "engine"]
    try:
        with services.postgres_server() as server:
            print(f"with_postgres: PostgreSQL on port {server.port}; running pytest {' '.join(pytest_args)}",
                  flush=True)
            env = {**os.environ, "DATABASE_URL": server.url}
            status = subprocess.call([sys.executable, "-m", "pytest", *pytest_args], cwd=REPO, env=env)
    except services.ServiceMissing as exc:
        if services.services_required():
            print(f"with_postgres: {exc}; GPUADMIN_REQUIRE_SERVICES=1, so this fails", file=sys.stderr)
            return 1
        print(f"with_postgres: skipped the PostgreSQL run: {exc}", file=sys.stderr)
        return 0
    if status == NO_TESTS_COLLECTED:
        # Nothing ran: the database tests are gone or the arguments select none.
        print("with_postgres: pytest selected no tests on PostgreSQL", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
