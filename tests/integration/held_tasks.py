"""The Celery app with two tasks of the tests' own, for a worker whose task a test must hold.

A worker started with ``-A tests.integration.held_tasks`` is central's (the app, its settings and
its bootsteps, gpuadmin.celery's) plus these: one that holds its pool process for a while, one
that leaves a line in a file. Their names are the tests' own, outside the protocol's
(gpuadmin.task_names): the test sends them to ``central`` by name of the queue.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuadmin.celery import app

HOLD = "tests.integration.hold"
NOTE = "tests.integration.note"

__all__ = ["HOLD", "NOTE", "app"]


@app.task(name=HOLD, ignore_result=True)
def hold(started_path: str, seconds: float) -> None:
    Path(started_path).write_text("started")
    time.sleep(seconds)


@app.task(name=NOTE, ignore_result=True)
def note(path: str, line: str) -> None:
    with open(path, "a") as notes:
        notes.write(line + "\n")
