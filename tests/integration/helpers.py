"""Helpers the integration tests share: real Celery workers in their own process groups.

The `start_worker` fixture (tests/integration/conftest.py) starts them and stops
every one at the end of the test.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE_DATABASE = "postgresql://nobody@127.0.0.1:1/none"
READY_TIMEOUT_SECONDS = 60


def database_url_for_workers() -> str:
    """A URL for the database this test runs on, for a worker process (PostgreSQL only)."""
    settings = connection.settings_dict
    credentials = quote(settings["USER"] or "", safe="")
    if settings.get("PASSWORD"):
        credentials += ":" + quote(settings["PASSWORD"], safe="")
    host = settings.get("HOST") or "127.0.0.1"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"postgresql://{credentials}@{host}{port}/{quote(settings['NAME'], safe='')}"


class Worker:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while " ready." not in self.log:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not ready within {READY_TIMEOUT_SECONDS} s:\n{self.log}")
            time.sleep(0.1)
