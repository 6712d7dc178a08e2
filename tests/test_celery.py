"""The Celery app's schedule and routes (gpuadmin/celery.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuadmin.celery import (
    CENTRAL_QUEUE,
    CENTRAL_UPDATES_QUEUE,
    UnroutedAgentTask,
    app,
    beat_schedule,
    host_queue,
)
from gpuadmin.wire import task_names


def queue_of(task_name: str, **options: object) -> str:
    return app.amqp.router.route(options, task_name)["queue"].name


def test_every_periodic_task_expires_before_its_next_run() -> None:
    schedule = beat_schedule()
    # No probes among them: each agent keeps its own clock (tests/integration/test_agent_probe_clock.py).
    assert {entry["task"] for entry in schedule.values()} == {
        "gpuadmin.kills.sweep", "gpuadmin.fleet.maintain_history",
        "gpuadmin.notify.warn_expiring", "gpuadmin.audit.anchor", "gpuadmin.usage.maintain",
        "gpuadmin.usage.send_digest", "gpuadmin.fairuse.evaluate", "gpuadmin.notify.sync_people",
    }
    for entry in schedule.values():
        assert 0 < entry["options"]["expires"] < entry["schedule"], entry


def test_the_app_runs_that_schedule() -> None:
    assert app.conf.beat_schedule == beat_schedule()
    assert app.conf.beat_schedule["sweep-kills"]["schedule"] == 5.0


@pytest.mark.parametrize("task_name", [
    "gpuadmin.fleet.ingest_snapshot", "gpuadmin.fleet.maintain_history",
    "gpuadmin.kills.sweep", "gpuadmin.kills.record_kill_progress", "gpuadmin.audit.anchor",
])
def test_central_tasks_go_to_the_central_queue_unless_told_otherwise(task_name: str) -> None:
    assert queue_of(task_name) == CENTRAL_QUEUE
    assert queue_of(task_name, queue="elsewhere") == "elsewhere"


def test_snapshot_updates_go_to_their_own_queue_whoever_sends_them() -> None:
    # Taken in batches there by central's workers (gpuadmin/fleet/update_batches.py).
    assert queue_of("gpuadmin.fleet.ingest_snapshot_update") == CENTRAL_UPDATES_QUEUE == "central.updates"


@pytest.mark.parametrize("task_name", ["gpuadmin.agent.probe_host", "gpuadmin.agent.execute_kill_order"])
def test_agent_tasks_go_only_to_the_host_queue_they_are_sent_to(task_name: str) -> None:
    assert queue_of(task_name, queue=host_queue("gpu07")) == "host.gpu07"
    with pytest.raises(UnroutedAgentTask, match="must be sent to a host's queue"):
        queue_of(task_name)


def test_an_agent_task_without_a_queue_is_refused_before_it_reaches_the_broker() -> None:
    with pytest.raises(UnroutedAgentTask):
        app.send_task("gpuadmin.agent.probe_host")


def test_every_task_is_registered_under_a_name_from_task_names_and_every_name_has_its_task() -> None:
    # The names are the wire protocol between central and agents (the literal
    # names above pin it): each defined once, each with a task behind it, on one side or the other.
    import gpuadmin.agent.worker  # noqa: F401  (the host side's tasks, as an agent's worker loads them)

    app.loader.import_default_modules()
    names = {value for key, value in vars(task_names).items() if key.isupper() and isinstance(value, str)
             and not key.endswith("PREFIX")}
    registered = {name for name in app.tasks if name.startswith("gpuadmin.")}
    assert registered == names


@pytest.mark.parametrize("signal_name", ["worker_process_init", "worker_ready"])
def test_a_worker_process_leaves_what_it_started_with_out_of_the_collectors_scans(signal_name: str) -> None:
    # In a forked child: the test process's own collector stays as it is.
    import gc
    import multiprocessing

    from celery import signals

    from gpuadmin.celery import GC_YOUNG_THRESHOLD

    def child(answer: Any) -> None:
        getattr(signals, signal_name).send(sender=None)
        answer.send((gc.get_threshold()[0], gc.get_freeze_count(), len(gc.get_objects())))

    theirs, ours = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=child, args=(theirs,))
    process.start()
    young, frozen, scanned = ours.recv()
    process.join(timeout=30)
    assert process.exitcode == 0
    assert young == GC_YOUNG_THRESHOLD > gc.get_threshold()[0]
    assert frozen > 10_000 > scanned  # Django, the apps: frozen; what the collector still looks at, little


LOADED_BY_WORKER = """
import json, sys
from celery.bin.celery import find_app
app = find_app(sys.argv[1])
app.loader.import_default_modules()  # what a worker imports before it consumes
print(json.dumps({"tasks": sorted(app.tasks),
                  "agent_modules": sorted(m for m in sys.modules if m.startswith("gpuadmin.agent"))}))
"""


@pytest.mark.parametrize("app_name, agent", [("gpuadmin", False), ("gpuadmin.agent.worker", True)])
def test_central_workers_load_no_agent_code_and_host_workers_load_both(app_name: str, agent: bool) -> None:
    import json
    import subprocess
    import sys

    shown = json.loads(subprocess.run([sys.executable, "-c", LOADED_BY_WORKER, app_name], capture_output=True,
                                      text=True, check=True, timeout=120).stdout)
    tasks = set(shown["tasks"])
    assert {task_names.INGEST_SNAPSHOT, task_names.SWEEP_KILLS} <= tasks
    assert ({task_names.PROBE_HOST, task_names.EXECUTE_KILL_ORDER} <= tasks) is agent
    assert bool(shown["agent_modules"]) is agent, shown["agent_modules"]
