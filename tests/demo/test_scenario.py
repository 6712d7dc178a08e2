"""The demo host's simulated GPUs (gpuadmin/demo/scenario.py): between them they show every GPU
health finding, through the simulated backend and the findings' own rules (no demo booted)."""

from __future__ import annotations

import json

from gpuadmin.demo.scenario import GPUS, HEALTH_CONDITIONS
from gpuadmin.fleet.findings import XID_MEANINGS, compute_findings
from gpuadmin.fleet.models import Finding
from gpuadmin.fleet.validation import parse_snapshot
from gpuadmin.probe.gpus import simulated
from tests.factories import snapshot


def test_the_demo_gpus_show_every_health_finding() -> None:
    gpus, _ = simulated._parse({"gpus": GPUS, "processes": []})
    document = snapshot(gpus=[gpu.as_document() for gpu in gpus])
    parse_snapshot(json.dumps(document))  # central accepts what the demo's GPUs say

    drafts = [d for d in compute_findings(document) if d.kind == Finding.Kind.GPU_HEALTH]

    conditions = {d.key.rpartition(":")[2] for d in drafts}
    assert conditions == HEALTH_CONDITIONS
    assert {f"xid_{xid}" for xid in XID_MEANINGS} <= conditions
    assert len(drafts) == len(HEALTH_CONDITIONS)  # each shown once, on one GPU
