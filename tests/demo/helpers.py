"""Helpers of the `make demo` tests: start the demo under the run harness, read what its host shows.

What the demo host shows is read straight from the demo's SQLite database, as
the host page reads it: the latest snapshot's processes and the open findings.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuadmin.demo.programs import DDP_WORKERS, LABEL, ORPHANED_WORKERS
from tests.run.helpers import SupervisedRun, hosts_in
from tests.services import free_port

HOST = "demo-test"
# A limit for a stuck run, not a speed check (benchmarks measure speed; the report has the figure).
SCENARIOS_TIMEOUT_SECONDS = 180
FINDINGS_QUERY = (
    "SELECT f.kind FROM fleet_finding f JOIN fleet_host h ON h.id = f.host_id "
    "WHERE h.name = ? AND f.resolved_at IS NULL"
)


@dataclass
class Demo:
    run: SupervisedRun
    env: dict[str, str]
    url: str  # http://127.0.0.1:<port> (no trailing slash)
    accounts: dict[str, str]  # name -> password, as printed
    groups: set[int]  # the supervisor's children's process groups

    @property
    def data_dir(self) -> Path:
        return Path(self.env["GPUADMIN_DATA_DIR"])


def start_demo(data_dir: Path) -> Demo:
    """`python -m gpuadmin.run --demo` under the harness, on a free port; returns once it says it runs."""
    port = free_port()
    dropped = {"DATABASE_URL", "REDIS_URL", "GPUADMIN_CENTRAL_PUBLIC_KEY", "GPUADMIN_SIMULATED_GPUS"}
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env.update({
        "GPUADMIN_DATA_DIR": str(data_dir),
        "PORT": str(port),
        "GPUADMIN_HOST_NAME": HOST,
        "GPUADMIN_WORKER_CONCURRENCY": "2",
        "GPUADMIN_ADMIN_USER": "boss",
        "GPUADMIN_ADMIN_PASSWORD": "correct horse battery",
    })
    run = SupervisedRun([sys.executable, "-m", "gpuadmin.run", "--demo"], env=env).start()
    demo = Demo(run, env, f"http://127.0.0.1:{port}", {}, set())
    try:
        run.wait_for_line(rf"gpuadmin demo is running at http://127\.0\.0\.1:{port}/", timeout_seconds=120)
    except BaseException:
        run.kill_everything(set(run.started_children().values()))
        raise
    demo.groups = set(run.started_children().values())
    demo.accounts = dict(re.findall(r"^\s+(demo-\w+)\s+password (\S+)", run.output, re.MULTILINE))
    return demo


def open_findings(env: dict[str, str], host: str) -> set[str]:
    database = Path(env["GPUADMIN_DATA_DIR"]) / "gpuadmin.sqlite3"
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
        return {kind for (kind,) in connection.execute(FINDINGS_QUERY, (host,))}


def open_health_conditions(env: dict[str, str], host: str) -> set[str]:
    """The conditions of the host's open GPU health findings (keys ``<uuid>:<condition>``)."""
    database = Path(env["GPUADMIN_DATA_DIR"]) / "gpuadmin.sqlite3"
    query = FINDINGS_QUERY.replace("f.kind", "f.key", 1) + " AND f.kind = 'gpu_health'"
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
        return {key.rpartition(":")[2] for (key,) in connection.execute(query, (host,))}


def role_of(process: dict[str, Any]) -> str:
    argv = process["cmdline"]
    return argv[argv.index("gpuadmin.demo.programs") + 1] if "gpuadmin.demo.programs" in argv else ""


def demo_processes(document: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in document.get("processes", []) if role_of(p) == role]


def missing_scenarios(document: dict[str, Any], findings: set[str]) -> list[str]:
    """The scenarios the demo host does not show yet (empty when it shows them all)."""
    processes = document.get("processes", [])
    by_role: dict[str, list[dict[str, Any]]] = {}
    for process in processes:
        by_role.setdefault(role_of(process), []).append(process)
    launchers = {p["pid"] for p in by_role.get("ddp-launcher", [])}
    ddp = [p for p in by_role.get("ddp-worker", []) if p["ppid"] in launchers and p["gpu_memory_bytes"]]
    parents = {p["pid"] for p in by_role.get("zombie-parent", [])}
    orphans = [p for p in by_role.get("orphaned-worker", []) if p["orphaned"] and p["gpu_memory_bytes"]]
    checks = {
        "DDP launcher with 4 ranks on 2 GPUs": len(ddp) == DDP_WORKERS
        and {gpu for p in ddp for gpu in p["gpu_memory_bytes"]} == {"GPU-demo-0", "GPU-demo-1"},
        "orphaned workers holding memory": len(orphans) == ORPHANED_WORKERS and "orphan_gpu" in findings,
        "zombies of a parent": any(p["state"] == "Z" and p["ppid"] in parents for p in processes)
        and "zombies" in findings,
        "trainer that checkpoints on SIGINT": bool(by_role.get("checkpointing-trainer")),
        "process that ignores SIGTERM": bool(by_role.get("ignores-sigterm")),
        "hostile command line": any("<script>alert('gpuadmin')</script>" in p["cmdline"]
                                    for p in by_role.get("hostile-command-line", [])),
        "unattributed memory": "unattributed_memory" in findings,
        "slow leak": "suspected_leak" in findings,
        "idle holder": "idle_holder" in findings and bool(by_role.get("idle-holder")),
        "simulated GPUs": document.get("gpu_backend", {}).get("name") == "simulated",
        "GPU health": "gpu_health" in findings,
        "every demo process labelled": all(p["cmdline"][-1] == LABEL for role, group in by_role.items()
                                           if role for p in group),
    }
    return [name for name, shown in checks.items() if not shown]


def wait_for_scenarios(demo: Demo) -> dict[str, dict]:
    """Every host's latest document, once the demo host shows every scenario."""
    missing: list[str] = ["not stored yet"]
    hosts: dict[str, dict] = {}
    deadline = time.monotonic() + SCENARIOS_TIMEOUT_SECONDS
    while missing and time.monotonic() < deadline:
        time.sleep(1)
        hosts = hosts_in(demo.env)
        if hosts.get(HOST):
            missing = missing_scenarios(hosts[HOST], open_findings(demo.env, HOST))
    assert not missing, f"the demo host does not show {missing}:\n{json.dumps(hosts.get(HOST))[:4000]}"
    return hosts
