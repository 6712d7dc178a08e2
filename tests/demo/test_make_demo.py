"""`make demo` for real (``python -m gpuadmin.run --demo``): every scenario shows on the demo host,
the synthetic hosts on the fleet, and Ctrl+C ends every demo process (nothing left, no zombie)."""

from __future__ import annotations

import os
import signal
import urllib.request
from pathlib import Path

from gpuadmin.demo.fleet import HOSTS as SYNTHETIC_HOSTS
from gpuadmin.demo.scenario import HEALTH_CONDITIONS
from tests.demo.helpers import HOST, open_findings, open_health_conditions, start_demo, wait_for_scenarios
from tests.run.helpers import in_groups_or_sessions, zombies_of


def test_make_demo_shows_every_scenario_and_ctrl_c_ends_every_demo_process(tmp_path: Path) -> None:
    demo = start_demo(tmp_path / "data")
    try:
        assert set(demo.accounts) == {"demo-requester", "demo-approver"}, demo.run.output
        children = demo.run.started_children()
        assert sum(name.startswith("demo: ") for name in children) == 9, children
        with urllib.request.urlopen(f"{demo.url}/login/", timeout=10) as response:
            assert response.status == 200

        hosts = wait_for_scenarios(demo)
        assert {h.name for h in SYNTHETIC_HOSTS} <= {name for name, document in hosts.items() if document}
        assert "zombies" in open_findings(demo.env, "sim-a100-02")
        assert "orphan_gpu" in open_findings(demo.env, HOST)
        assert open_health_conditions(demo.env, HOST) == HEALTH_CONDITIONS
        # web and worker with their own children, 14 demo processes and their zombies
        assert len(in_groups_or_sessions(demo.groups)) > 20

        os.kill(demo.run.command_pid, signal.SIGINT)
        exit_status, leftovers = demo.run.finish(timeout_seconds=90)
        assert exit_status == 0, demo.run.output
        assert leftovers == [], leftovers
        assert in_groups_or_sessions(demo.groups) == []
        assert zombies_of({demo.run.command_pid}) == []
        # The trainer heard SIGINT, as a Ctrl+C'd training job does, and saved its checkpoint.
        assert list((demo.data_dir / "scenario").glob("checkpoint-*.txt")), demo.run.output
    finally:
        demo.run.kill_everything(demo.groups)
