"""The agent's probe task side (gpuadmin/agent/probing.py), in process.

No test here is marked django_db: pytest-django refuses any database access
in them, so each one also proves that the agent side needs no database. The
integration test repeats this with a real agent worker whose DATABASE_URL
leads nowhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from kombu import Message

from gpuadmin import sending
from gpuadmin.agent import probing
from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, app, host_queue
from gpuadmin.data_dir import AGENT_SIGNING_KEY
from gpuadmin.probe.budget import CMDLINE_TIGHT_MAX_BYTES, escaped_size, fit_snapshot
from gpuadmin.wire.signing import MessageKind, canonical_json, fingerprint, load_private_key, open_envelope
from gpuadmin.wire.task_names import INGEST_SNAPSHOT, INGEST_SNAPSHOT_UPDATE, PROBE_HOST

SCHEMA = json.loads((Path(probing.__file__).parents[1] / "wire" / "snapshot.schema.json").read_text())
GPU_UUID = "GPU-a9e17000-0000-4000-8000-000000000001"
GiB = 2**30


@pytest.fixture
def gpu_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen]:
    """A real process holding 5 GiB of a simulated GPU, the agent configured to see it."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "agent-unit-holder"])
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({
        "gpus": [{"uuid": GPU_UUID, "name": "Simulated L4", "memory_total_bytes": 24 * GiB,
                  "extra_used_bytes": GiB, "utilization_percent": 10}],
        "processes": [{"pid": holder.pid, "gpu_uuid": GPU_UUID, "used_memory_bytes": 5 * GiB}],
    }))
    monkeypatch.setenv("GPUADMIN_GPU_BACKEND", "simulated")
    monkeypatch.setenv("GPUADMIN_SIMULATED_GPUS", str(gpus))
    yield holder
    holder.kill()
    holder.wait()


def drain(queue_name: str) -> list[Message]:
    """Every message now waiting in a queue of this test run's broker (the filesystem one)."""
    messages = []
    with app.connection_for_read() as connection, connection.SimpleQueue(queue_name) as queue:
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                return messages
            message.ack()
            messages.append(message)


def test_probe_host_sends_one_valid_snapshot_signed_by_the_agent_to_central(
    gpu_holder, settings, tmp_path
) -> None:
    settings.GPUADMIN_HOST_NAME = "agent-unit"
    settings.DATA_DIR = tmp_path / "agent-data"
    settings.DATA_DIR.mkdir(mode=0o700)
    drain(CENTRAL_QUEUE)

    size_bytes = probing.probe_host.apply().get()

    [message] = [m for m in drain(CENTRAL_QUEUE) if m.headers["task"] == INGEST_SNAPSHOT]
    args, kwargs, _ = message.decode()
    assert kwargs == {} and len(args) == 1
    # Signed with the key the agent made in its data directory on first use (0600).
    key_file = settings.DATA_DIR / AGENT_SIGNING_KEY
    assert key_file.stat().st_mode & 0o777 == 0o600
    opened = open_envelope(args[0], MessageKind.SNAPSHOT)
    assert opened.fingerprint == fingerprint(load_private_key(key_file))
    assert len(opened.text) == size_bytes
    snapshot = json.loads(opened.text)
    jsonschema.validate(snapshot, SCHEMA)
    assert snapshot["host"]["name"] == "agent-unit"
    assert snapshot["gpu_backend"]["name"] == "simulated"
    [gpu] = snapshot["gpus"]
    assert (gpu["uuid"], gpu["memory_used_bytes"]) == (GPU_UUID, 6 * GiB)
    holder = next(p for p in snapshot["processes"] if p["pid"] == gpu_holder.pid)
    assert holder["gpu_memory_bytes"] == {GPU_UUID: 5 * GiB}
    assert "agent-unit-holder" in holder["cmdline"]
    # Stale snapshots are dropped rather than ingested late.
    assert message.headers["expires"] is not None


def test_request_probe_goes_to_that_hosts_queue_and_expires(settings) -> None:
    drain(host_queue("gpu42"))
    drain(CENTRAL_QUEUE)

    sending.request_probe("gpu42")

    [message] = drain(host_queue("gpu42"))
    assert message.headers["task"] == PROBE_HOST
    assert message.headers["expires"] is not None
    assert PROBE_HOST not in {m.headers["task"] for m in drain(CENTRAL_QUEUE)}


def test_a_bad_probe_setting_fails_the_task_with_the_settings_name(monkeypatch, settings) -> None:
    settings.GPUADMIN_HOST_NAME = "agent-unit"
    monkeypatch.setenv("GPUADMIN_GPU_BACKEND", "cuda-please")

    with pytest.raises(ValueError, match="GPU backend must be one of"):
        probing.probe_host.apply().get()


def test_the_agent_fits_what_it_sends_under_its_snapshot_size_limit(gpu_holder, settings, tmp_path) -> None:
    """GPUADMIN_SNAPSHOT_MAX_BYTES, read from the agent's environment as central reads it: rows
    beyond it are left out and counted, the GPU holder first (gpuadmin/probe/budget.py)."""
    settings.GPUADMIN_HOST_NAME = "agent-unit"
    settings.DATA_DIR = tmp_path / "agent-data"
    settings.DATA_DIR.mkdir(mode=0o700)
    zombies = [subprocess.Popen(["true"]) for _ in range(3)]  # not waited for: rows of lower rank
    wait_for_zombies(zombies)
    whole = json.loads(probing.signed_snapshot("agent-unit")["text"])
    assert "left_out" not in whole  # this test process's tree fits 8 MiB whole
    rows = {p["pid"]: p for p in whole["processes"]}
    chain, pid = [], gpu_holder.pid
    while pid in rows:
        chain.append(rows[pid])
        pid = rows[pid]["ppid"]
    # Room for the holder's tree with short command lines, the envelope and the left_out note
    # (450 B), not for a zombie's row as well.
    tree = fit_snapshot({**whole, "processes": chain}, max_bytes=2**30,
                        cmdline_row_max_bytes=CMDLINE_TIGHT_MAX_BYTES)
    settings.GPUADMIN_SNAPSHOT_MAX_BYTES = escaped_size(canonical_json(tree)) + 450

    message = probing.signed_snapshot("agent-unit")

    assert len(json.dumps(message, separators=(",", ":"))) <= settings.GPUADMIN_SNAPSHOT_MAX_BYTES
    snapshot = json.loads(open_envelope(message, MessageKind.SNAPSHOT).text)
    jsonschema.validate(snapshot, SCHEMA)
    pids = {p["pid"] for p in snapshot["processes"]}
    assert gpu_holder.pid in pids
    # Counted exactly in tests/probe/test_budget.py; here the host's process table moves between
    # the two readings (other test workers make zombies too), so only "some were left out".
    assert snapshot["left_out"]["processes"] > 0
    for zombie in zombies:
        zombie.wait()


def wait_for_zombies(children: list[subprocess.Popen]) -> None:
    """Until each child has exited and waits, unreaped, as a zombie (not a timing assertion)."""
    for child in children:
        for _ in range(1000):
            with open(f"/proc/{child.pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)


def test_the_next_probe_sends_an_update_and_a_probe_asking_for_full_sends_a_snapshot(
    gpu_holder, settings, tmp_path
) -> None:
    """The task side of gpuadmin/agent/snapshot_choice.py: the same host again is an update to central's
    update task; ``full`` (central could not apply one) is a full snapshot again."""
    settings.GPUADMIN_HOST_NAME = "agent-unit"
    settings.DATA_DIR = tmp_path / "agent-data"
    settings.DATA_DIR.mkdir(mode=0o700)
    settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES = 2**40  # nothing of this test process moves past it
    drain(CENTRAL_QUEUE)

    drain(CENTRAL_UPDATES_QUEUE)

    def probe(**kwargs: Any) -> tuple[str, str]:
        """The queue and task of what the probe sent; updates go to a queue of their own."""
        probing.probe_host.apply(kwargs=kwargs).get()
        [sent] = [(queue, m.headers["task"]) for queue in (CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE)
                  for m in drain(queue) if m.headers["task"] in (INGEST_SNAPSHOT, INGEST_SNAPSHOT_UPDATE)]
        return sent

    assert probe() == (CENTRAL_QUEUE, INGEST_SNAPSHOT)
    # This machine's process table is shared: a zombie of someone else's comes or goes, and that is a
    # full snapshot, as it should be. A few probes in a row, one of them finds it steady.
    assert (CENTRAL_UPDATES_QUEUE, INGEST_SNAPSHOT_UPDATE) in [probe() for _ in range(5)]
    assert probe(full=True) == (CENTRAL_QUEUE, INGEST_SNAPSHOT)
