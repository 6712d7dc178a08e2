"""The demo's scenario (gpuadmin/demo/scenario.py) without booting the demo: the simulated GPUs
show every GPU health finding, and Ctrl+C stops the trainer the way its story needs.

The whole `make demo` is booted once, by tests/browser/test_demo.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from gpuadmin.demo.scenario import GPUS, HEALTH_CONDITIONS
from gpuadmin.fleet.findings.rules import XID_MEANINGS, compute_findings
from gpuadmin.fleet.intake.validation import parse_snapshot
from gpuadmin.fleet.models import Finding
from gpuadmin.probe.gpus import simulated
from tests.factories import snapshot
from tests.run.helpers import SupervisedRun

# The demo's supervisor with only the trainer, as `make demo` builds it (scenario.children()).
SUPERVISED_TRAINER = textwrap.dedent("""
    import os, sys
    from gpuadmin.demo import claims
    from gpuadmin.demo.scenario import children
    from gpuadmin.run import Supervisor, become_subreaper
    become_subreaper()
    claims.prepare()
    trainers = [child for child in children() if "checkpoints on SIGINT" in child.name]
    out = lambda line: print(line, flush=True)
    sys.exit(Supervisor(trainers, dict(os.environ), out=out, stop_grace_seconds=10).run())
""")


def test_the_demo_gpus_show_every_health_finding() -> None:
    gpus, _ = simulated._parse({"gpus": GPUS, "processes": []})
    document = snapshot(gpus=[gpu.as_document() for gpu in gpus])
    parse_snapshot(json.dumps(document))  # central accepts what the demo's GPUs say

    drafts = [d for d in compute_findings(document) if d.kind == Finding.Kind.GPU_HEALTH]

    conditions = {d.key.rpartition(":")[2] for d in drafts}
    assert conditions == HEALTH_CONDITIONS
    assert {f"xid_{xid}" for xid in XID_MEANINGS} <= conditions
    assert len(drafts) == len(HEALTH_CONDITIONS)  # each shown once, on one GPU


def test_ctrl_c_stops_the_trainer_with_sigint_and_it_saves_its_checkpoint(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    env = {**os.environ, "GPUADMIN_DATA_DIR": str(data_dir)}
    run = SupervisedRun([sys.executable, "-c", SUPERVISED_TRAINER], env=env).start()
    groups: set[int] = set()
    try:
        started = run.wait_for_line(r"gpuadmin: started demo: trainer .* \(pid (\d+)\)", timeout_seconds=60)
        trainer = int(started.group(1))
        groups = set(run.started_children().values())
        claim = data_dir / "scenario" / "claims" / f"{trainer}.json"
        deadline = time.monotonic() + 60
        while not claim.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # its claim is written once its handler is in place
        assert claim.exists(), run.output

        os.kill(run.command_pid, signal.SIGINT)
        exit_status, leftovers = run.finish(timeout_seconds=60)

        assert (exit_status, leftovers) == (0, []), run.output
        checkpoint = data_dir / "scenario" / f"checkpoint-{trainer}.txt"
        assert checkpoint.read_text().startswith("checkpoint written on SIGINT"), run.output
        assert "did not stop in time" not in run.output
    finally:
        run.kill_everything(groups)
