"""`python -m gpuadmin.probe --json`: the CLI as a separate process, as an admin or the agent runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.probe.conftest import Device
from tests.probe.helpers import REPO, Processes, assert_valid, rows_by_pid

GiB = 1024**3
PROBE_ENV = ("GPUADMIN_GPU_BACKEND", "GPUADMIN_SIMULATED_GPUS", "GPUADMIN_DEVICE_GLOB", "GPUADMIN_HOST_NAME")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in PROBE_ENV}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpuadmin.probe", *args], capture_output=True, text=True,
                          cwd=REPO, env=environment, timeout=60, check=False)


def cli_snapshot(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_cli(*args, env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert_valid(document)
    return document


def gpus_file(tmp_path: Path, pid: int) -> str:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({
        "gpus": [{"uuid": "GPU-sim-0", "name": "Simulated H100", "memory_total_bytes": 80 * GiB,
                  "extra_used_bytes": 0, "utilization_percent": 50}],
        "processes": [{"pid": pid, "gpu_uuid": "GPU-sim-0", "used_memory_bytes": 2 * GiB}],
    }))
    return str(path)


def test_cli_prints_one_valid_snapshot_with_simulated_gpus(
    tmp_path: Path, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    holder = processes.start("holder", device.path)

    document = cli_snapshot("--json", "--gpu-backend", "simulated",
                            "--simulated-gpus", gpus_file(tmp_path, worker.pid),
                            "--device-glob", device.glob, "--host-name", "gpu-test-01")

    assert document["schema_version"] == 2
    assert document["scope"] == "matters"
    assert document["host"]["name"] == "gpu-test-01"
    assert document["gpu_backend"] == {"name": "simulated", "available": True, "reason": None}
    assert document["gpus"][0]["memory_used_bytes"] == 2 * GiB
    rows = rows_by_pid(document)
    assert rows[worker.pid]["gpu_memory_bytes"] == {"GPU-sim-0": 2 * GiB}
    assert rows[holder.pid]["device_files"] == [device.path]
    assert document["host"]["agent_pid"] not in (None, os.getpid())  # the CLI process, not this one


def test_all_lists_every_process(processes: Processes, device: Device) -> None:
    bystander = processes.start("sleeper")

    document = cli_snapshot("--json", "--all", "--gpu-backend", "none", "--device-glob", device.glob)

    assert document["scope"] == "all"
    counts = document["process_counts"]
    assert counts["omitted"] == 0
    assert len(document["processes"]) == counts["total"]
    assert all(row["reasons"] for row in document["processes"])
    assert rows_by_pid(document)[bystander.pid]["reasons"] == ["all"]


def test_without_all_a_bystander_is_only_counted(processes: Processes, device: Device) -> None:
    bystander = processes.start("sleeper")

    document = cli_snapshot("--json", "--gpu-backend", "none", "--device-glob", device.glob)

    assert bystander.pid not in rows_by_pid(document)
    assert document["process_counts"]["omitted"] >= 1


def test_options_default_to_the_agents_environment(
    tmp_path: Path, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    holder = processes.start("holder", device.path)
    env = {"GPUADMIN_GPU_BACKEND": "simulated", "GPUADMIN_SIMULATED_GPUS": gpus_file(tmp_path, worker.pid),
           "GPUADMIN_DEVICE_GLOB": device.glob, "GPUADMIN_HOST_NAME": "from-env"}

    from_env = cli_snapshot("--json", env=env)
    overridden = cli_snapshot("--json", "--gpu-backend", "none", "--host-name", "from-flag", env=env)

    assert from_env["host"]["name"] == "from-env"
    assert from_env["gpu_backend"]["name"] == "simulated"
    assert from_env["device_glob"] == device.glob
    assert rows_by_pid(from_env)[holder.pid]["device_files"] == [device.path]
    assert overridden["host"]["name"] == "from-flag"
    assert overridden["gpu_backend"]["name"] == "none"


def test_pretty_output_is_the_same_document_indented(device: Device) -> None:
    result = run_cli("--json", "--pretty", "--gpu-backend", "none", "--device-glob", device.glob)

    assert result.returncode == 0
    assert result.stdout.startswith('{\n  "schema_version": 2,')
    assert_valid(json.loads(result.stdout))


def test_an_unusable_host_name_is_a_clear_error(device: Device) -> None:
    result = run_cli("--json", "--gpu-backend", "none", env={"GPUADMIN_HOST_NAME": "bad name;rm"})

    assert result.returncode == 2
    assert result.stdout == ""
    assert "host name 'bad name;rm' is not usable" in result.stderr
    assert "GPUADMIN_HOST_NAME" in result.stderr


def test_json_is_required_and_backends_are_checked() -> None:
    assert run_cli().returncode == 2
    wrong = run_cli("--json", "--gpu-backend", "cuda")
    assert wrong.returncode == 2
    assert "invalid choice: 'cuda'" in wrong.stderr


IMPORT_CHECK = """
import pkgutil, runpy, sys
import gpuadmin.probe
for module in pkgutil.walk_packages(gpuadmin.probe.__path__, "gpuadmin.probe."):
    if module.name != "gpuadmin.probe.__main__":
        __import__(module.name)
sys.argv = ["gpuadmin.probe", "--json", "--gpu-backend", "auto"]
try:
    runpy.run_module("gpuadmin.probe", run_name="__main__")
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
forbidden = sorted(m for m in sys.modules
                   if m.split(".")[0] in ("django", "celery", "kombu", "rest_framework", "psycopg")
                   or m in ("gpuadmin.settings", "gpuadmin.celery"))
print("FORBIDDEN", forbidden, file=sys.stderr)
"""


def test_the_probe_imports_no_django_and_no_celery() -> None:
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True, cwd=REPO,
                            env=environment, timeout=60, check=False)

    assert result.returncode == 0, result.stderr
    assert "FORBIDDEN []" in result.stderr
    json.loads(result.stdout)  # the CLI ran and printed its snapshot
