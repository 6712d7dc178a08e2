"""`make demo` for real (``python -m gpuadmin.run --demo``): every scenario shows on the demo host,
the synthetic hosts on the fleet, and Ctrl+C ends every demo process (nothing left, no zombie).

Read straight from the demo's SQLite database, as the host page reads it:
the latest snapshot's processes and the host's open findings.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpuadmin.demo.fleet import HOSTS as SYNTHETIC_HOSTS
from gpuadmin.demo.programs import DDP_WORKERS, LABEL, ORPHANED_WORKERS
from tests.run.helpers import SupervisedRun, hosts_in, in_groups_or_sessions, zombies_of
from tests.services import free_port

HOST = "demo-test"
FINDINGS_QUERY = (
    "SELECT f.kind FROM fleet_finding f JOIN fleet_host h ON h.id = f.host_id "
    "WHERE h.name = ? AND f.resolved_at IS NULL"
)


def open_findings(env: dict[str, str], host: str) -> set[str]:
    database = Path(env["GPUADMIN_DATA_DIR"]) / "gpuadmin.sqlite3"
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
        return {kind for (kind,) in connection.execute(FINDINGS_QUERY, (host,))}


def role_of(process: dict[str, Any]) -> str:
    argv = process["cmdline"]
    return argv[argv.index("gpuadmin.demo.programs") + 1] if "gpuadmin.demo.programs" in argv else ""


def missing_scenarios(document: dict[str, Any], findings: set[str]) -> list[str]:
    """The scenarios the demo host does not show yet (empty when it shows them all)."""
    processes = document.get("processes", [])
    by_role: dict[str, list[dict[str, Any]]] = {}
    for process in processes:
        by_role.setdefault(role_of(process), []).append(process)
    launchers = {p["pid"] for p in by_role.get("ddp-launcher", [])}
    ddp = [p for p in by_role.get("ddp-worker", []) if p["ppid"] in launchers and p["gpu_memory_bytes"]]
    parents = {p["pid"] for p in by_role.get("zombie-parent", [])}
    checks = {
        "DDP launcher with 4 ranks on 2 GPUs": len(ddp) == DDP_WORKERS
        and {gpu for p in ddp for gpu in p["gpu_memory_bytes"]} == {"GPU-demo-0", "GPU-demo-1"},
        "orphaned workers holding memory": len([p for p in by_role.get("orphaned-worker", []) if p["orphaned"]])
        == ORPHANED_WORKERS and "orphan_gpu" in findings,
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
        "every demo process labelled": all(p["cmdline"][-1] == LABEL for role, group in by_role.items()
                                           if role for p in group),
    }
    return [name for name, shown in checks.items() if not shown]


def test_make_demo_shows_every_scenario_and_ctrl_c_ends_every_demo_process(tmp_path: Path) -> None:
    port = free_port()
    dropped = {"DATABASE_URL", "REDIS_URL", "GPUADMIN_CENTRAL_PUBLIC_KEY", "GPUADMIN_SIMULATED_GPUS"}
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env.update({
        "GPUADMIN_DATA_DIR": str(tmp_path / "data"),
        "PORT": str(port),
        "GPUADMIN_HOST_NAME": HOST,
        "GPUADMIN_WORKER_CONCURRENCY": "2",
        "GPUADMIN_ADMIN_USER": "boss",
        "GPUADMIN_ADMIN_PASSWORD": "correct horse battery",
    })
    run = SupervisedRun([sys.executable, "-m", "gpuadmin.run", "--demo"], env=env).start()
    groups: set[int] = set()
    try:
        run.wait_for_line(rf"gpuadmin demo is running at http://127\.0\.0\.1:{port}/", timeout_seconds=120)
        accounts = dict(re.findall(r"^\s+(demo-\w+)\s+password (\S+)", run.output, re.MULTILINE))
        assert set(accounts) == {"demo-requester", "demo-approver"}, run.output
        children = run.started_children()
        groups = set(children.values())
        assert sum(name.startswith("demo: ") for name in children) == 9, children
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=10) as response:
            assert response.status == 200

        missing: list[str] = ["not stored yet"]
        hosts: dict[str, dict] = {}
        deadline = time.monotonic() + 180  # a limit for a stuck run, not a speed check (benchmarks do that)
        while missing and time.monotonic() < deadline:
            time.sleep(1)
            hosts = hosts_in(env)
            if hosts.get(HOST):
                missing = missing_scenarios(hosts[HOST], open_findings(env, HOST))
        assert not missing, f"the demo host does not show {missing}:\n{json.dumps(hosts.get(HOST))[:4000]}"
        assert {h.name for h in SYNTHETIC_HOSTS} <= {name for name, document in hosts.items() if document}
        assert "zombies" in open_findings(env, "sim-a100-02")

        demo_processes = in_groups_or_sessions(groups)
        assert len(demo_processes) > 20, demo_processes  # web and worker, 14 demo processes, zombies

        os.kill(run.command_pid, signal.SIGINT)
        exit_status, leftovers = run.finish(timeout_seconds=90)
        assert exit_status == 0, run.output
        assert leftovers == [], leftovers
        assert in_groups_or_sessions(groups) == []
        assert zombies_of({run.command_pid}) == []
        # The trainer heard SIGINT, as a Ctrl+C'd training job does, and saved its checkpoint.
        assert list((tmp_path / "data" / "scenario").glob("checkpoint-*.txt")), run.output
    finally:
        run.kill_everything(groups)
