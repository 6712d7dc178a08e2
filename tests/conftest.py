"""Suite-wide fixtures and rules.

- `redis_server`, `postgres_server`: real servers started for the session on a
  free port (tests/services.py). Not installed: skip with the reason, or fail
  when GPUADMIN_REQUIRE_SERVICES=1 (CI), where any skip at all is a failure.
- Tests marked `postgres` are deselected unless the database is PostgreSQL
  (deselected, not skipped: CI allows no skips). `--db-only` keeps only the
  tests that use the database.
- Two tiers: `slow` (a whole stack, real workers, a browser, benchmarks) is set
  here by path (SLOW_PATHS) and on every `services` test; `make test-fast` runs
  `-m "not slow"`. `engine` (what depends on the database engine: locks,
  prepared statements, triggers, concurrency, migrations) is set by path
  (ENGINE_PATHS) and on every `postgres` test; tests/with_postgres.py runs
  `-m engine` on PostgreSQL. Either can also be put on a test by hand.
- Named people (`viewer`, `requester`, `approver`, `second_approver`,
  `stranger`, `viewer_client`, `requester_client`) come from tests/people.py,
  and so does `fast_password_hashing`, autouse for every test.
- `make test` runs the suite on pytest-xdist workers, every test among the others
  (tests/README.md).
- On SQLite the test database is a file in the run's GPUADMIN_DATA_DIR (see
  tests/environment.py), at the path gpuadmin.settings gives it, so worker
  processes started by a test with the same GPUADMIN_DATA_DIR share it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests import services
from tests.accounts.directory.fixtures import (  # noqa: F401 - fixtures: slapd, an OIDC provider
    ldap_directory,
    oidc_provider,
    slapd,
    use_ldap,
    use_oidc,
)
from tests.audit.helpers import allow_test_flush_through_audit_triggers
from tests.people import (  # noqa: F401 - fixtures (named people), for every directory
    approver,
    fast_password_hashing,
    requester,
    requester_client,
    second_approver,
    stranger,
    viewer,
    viewer_client,
)

# transaction=True tests end with a flush (TRUNCATE), which the audit table's
# PostgreSQL triggers refuse outside tests; see tests/audit/helpers.py.
allow_test_flush_through_audit_triggers()

DB_FIXTURES = {
    "db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
    "live_server", "django_db_setup", "admin_user", "admin_client", "django_user_model",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--db-only", action="store_true",
                     help="run only the tests that use the database (tests/with_postgres.py uses it)")


def database_vendor() -> str:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    return "postgresql" if "postgresql" in engine else engine.rsplit(".", 1)[-1]


# --- parallel runs (make test: pytest -n 4 --dist load --maxschedchunk 1) ---------

def uses_database(item: pytest.Item) -> bool:
    if item.get_closest_marker("django_db") or item.get_closest_marker("postgres"):
        return True
    return bool(DB_FIXTURES & set(getattr(item, "fixturenames", ())))


# --- tiers: slow (make test only) and engine (the PostgreSQL pass) ------------------------

TESTS = Path(__file__).resolve().parent
# By place, so that a new test there is in its tier without anyone remembering to mark it.
# Everything under a folder ending in "/", or one module.
SLOW_PATHS = (
    "browser/",  # Chromium, and (test_demo.py) a whole `make demo`
    "integration/",  # redis-server and real Celery workers
    "benchmarks/",  # every benchmark script's smoke run, soak.py's included
    "run/test_make_run.py",  # a whole `make run`
    # slapd and an OpenID Connect provider under node (tests/accounts/directory/fixtures.py)
    "accounts/directory/", "notify/test_people_from_directory.py",
)
# What behaves differently on PostgreSQL: row locks, fleet.storage.statements' prepared statements and
# row arrays, the audit table's triggers and advisory lock, json_text's compression, migrations
# with SQL of their own, transactions between threads and processes, column ranges and
# aggregate types that SQLite does not enforce. The rest runs on SQLite only.
ENGINE_PATHS = (
    "audit/test_append_only.py", "audit/test_anchors.py", "audit/test_chain.py",
    "audit/test_verify_command.py",
    "fairuse/test_services.py",
    "fleet/findings/test_sync.py",
    "fleet/history/test_record.py", "fleet/history/test_retention.py", "fleet/history/test_series.py",
    "fleet/intake/test_ingest.py", "fleet/intake/test_ingest_writes.py", "fleet/intake/test_trust.py",
    "fleet/intake/test_updates.py", "fleet/intake/test_updates_in_batches.py",
    "fleet/storage/test_json_text.py", "fleet/storage/test_statements.py",
    "fleet/storage/test_table_settings.py",
    "fleet/test_latest_document_migration.py",
    "fleet/test_querysets.py",
    "kills/test_concurrent_approvals.py", "kills/test_decisions.py", "kills/test_dispatch.py",
    "kills/test_memory_released.py", "kills/test_service_contract.py",
    "web/test_fleet_page.py",
    "usage/test_ledger.py", "usage/test_ledger_updates.py",
    "integration/test_snapshot_flow.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # A test module moved or renamed must not leave its tier silently: the PostgreSQL pass once lost
    # half its tests when tests/fleet/ was split into folders.
    missing = [path for path in (*SLOW_PATHS, *ENGINE_PATHS, *LONGEST_PATHS) if not (TESTS / path).exists()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py names test paths that do not exist: {', '.join(missing)}")
    # Registered beside the rules that set them (--strict-markers); pyproject.toml has the others.
    for marker in ("slow: not in `make test-fast` (SLOW_PATHS, `services` tests, or by hand)",
                   "engine: run again on PostgreSQL (ENGINE_PATHS, `postgres` tests, or by hand)"):
        config.addinivalue_line("markers", marker)
    config.pluginmanager.register(LongestFirst(), "gpuadmin-longest-first")


def in_paths(item: pytest.Item, paths: tuple[str, ...]) -> bool:
    try:
        place = item.path.relative_to(TESTS).as_posix()
    except ValueError:
        return False
    return any(place.startswith(path) if path.endswith("/") else place == path for path in paths)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if in_paths(item, SLOW_PATHS) or item.get_closest_marker("services"):
            item.add_marker(pytest.mark.slow)
        if in_paths(item, ENGINE_PATHS) or item.get_closest_marker("postgres"):
            item.add_marker(pytest.mark.engine)
    on_postgres = database_vendor() == "postgresql"
    db_only = config.getoption("--db-only")
    keep, drop = [], []
    for item in items:
        wrong_database = bool(item.get_closest_marker("postgres")) and not on_postgres
        (drop if wrong_database or (db_only and not uses_database(item)) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --- parallel runs: the longest first ------------------------------------------------------

# The longest tests (30-80 s each under coverage on 2 cores: a whole stack, the benchmarks' smoke runs)
# go first of their phase, then the rest of the slow tier, then the fast tier: the workers then end on
# short tests together instead of one of them running `make demo` alone at the end.
LONGEST_PATHS = (
    "benchmarks/test_smoke.py", "browser/test_demo.py", "browser/test_kill_flow.py",
    "browser/test_every_page.py", "run/test_make_run.py", "integration/test_several_agents.py",
    "integration/test_faults.py", "test_db_router.py", "broker/test_filesystem.py",
)


def django_phase(item: pytest.Item) -> int:
    """pytest-django's order: 0 plain `db` tests, 1 transactional ones (their flush empties the tables
    the migrations filled, so no `db` test may follow one in a process), 2 tests without the database."""
    from django.test import TestCase, TransactionTestCase
    from pytest_django.fixtures import validate_django_db

    cls = getattr(item, "cls", None)
    if cls and issubclass(cls, TransactionTestCase):
        return 0 if issubclass(cls, TestCase) else 1
    marker = item.get_closest_marker("django_db")
    transaction, reset_sequences, *_ = validate_django_db(marker) if marker else (False, False)
    fixtures = set(getattr(item, "fixturenames", ()))
    if transaction or reset_sequences or fixtures & {"transactional_db", "live_server"}:
        return 1
    return 0 if marker or "db" in fixtures else 2


class LongestFirst:
    """Reorders within pytest-django's phases (after its own sort), never across them.

    `--dist load --maxschedchunk 1` (Makefile) hands each worker the next test of this order as it
    finishes one, so every worker runs its tests in this order too: phases stay in order per worker.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        phases = [django_phase(item) for item in items]
        # pytest's own grouping by parametrized fixtures (Playwright's browser_name) may have moved tests
        # without the database; those that use it must still be in pytest-django's order.
        in_database = [phase for phase in phases if phase != 2]
        if in_database != sorted(in_database):  # pytest-django sorts by another rule now
            raise pytest.UsageError("tests/conftest.py's django_phase no longer agrees with pytest-django's "
                                    "order; update it before reordering the tests")
        ranks = [(phase, 0 if in_paths(item, LONGEST_PATHS) else 1 if item.get_closest_marker("slow") else 2)
                 for item, phase in zip(items, phases, strict=True)]
        items[:] = [items[i] for i in sorted(range(len(items)), key=ranks.__getitem__)]  # stable


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"gpuadmin: database {database_vendor()}, data dir {os.environ.get('GPUADMIN_DATA_DIR')}, "
        f"GPUADMIN_REQUIRE_SERVICES={'1' if services.services_required() else 'unset'}"
    ]


# --- CI: nothing may skip --------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    if services.services_required() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but GPUADMIN_REQUIRE_SERVICES=1 allows no skips: {reason}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    report = yield
    if services.services_required() and report.skipped:
        report.outcome = "failed"
        reason = report.longrepr
        report.longrepr = f"skipped at collection, but GPUADMIN_REQUIRE_SERVICES=1 allows no skips: {reason}"
    return report


# --- database ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        # A file, not pytest-django's in-memory default, so that worker processes
        # see the test's data; the run's data dir is temporary anyway.
        database.setdefault("TEST", {})["NAME"] = str(database["NAME"])


# Django asks SQLite once per connection, the first time a query needs to know, whether it has JSON
# functions (`SELECT JSON('{"a": "b"}')`, `features.supports_json_field`). Inside a test that counts its
# queries, that one query made the count depend on which test ran first in the worker process: a test
# that passed in the whole suite failed alone. Asked once, as the test database is set up, it is never a
# test's to count.
@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    from django.db import connection

    with django_db_blocker.unblock():
        _ = connection.features.supports_json_field


# --- servers -------------------------------------------------------------------------


Server = TypeVar("Server")


def _serve(start: Callable[[], AbstractContextManager[Server]]) -> Iterator[Server]:
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(start())
        except services.ServiceMissing as exc:
            services.missing(str(exc))
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[services.RedisServer]:
    yield from _serve(services.redis_server)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[services.PostgresServer]:
    yield from _serve(services.postgres_server)


@pytest.fixture
def host_in_another_time_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is UTC+05:30 (a POSIX TZ string needs no tz database)."""
    monkeypatch.setenv("TZ", "XST-05:30")
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()
# --- account changes in the audit log ------------------------------------------------


@pytest.fixture(autouse=True)
def _account_changes_unaudited_unless_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests make people all the time; only tests marked ``account_audit`` get their audit events.

    Tests of the audit log count exactly the events they write; the account
    events themselves are tested under the marker (tests/accounts/).
    """
    if request.node.get_closest_marker("account_audit") or "django" not in sys.modules:
        yield
        return
    from gpuadmin.accounts import audit_trail

    audit_trail.disconnect()
    try:
        yield
    finally:
        audit_trail.connect()


# --- the audit page's memory ----------------------------------------------------------


@pytest.fixture(autouse=True)
def _forget_audit_checkpoints() -> Iterator[None]:
    """Each test's database starts over; the audit page's verified prefix (per process) must too."""
    yield
    verified_prefix = sys.modules.get("gpuadmin.audit.verified_prefix")
    if verified_prefix is not None:
        verified_prefix.forget()
