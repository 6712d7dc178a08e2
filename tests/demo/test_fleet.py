"""The demo's synthetic hosts: valid snapshots, with a Slurm job and a container whose owners come
from the probe's own reading of their cgroup lines."""

from __future__ import annotations

import json

from gpuadmin.demo import fleet
from gpuadmin.fleet.intake.validation import parse_snapshot
from gpuadmin.fleet.process_tree import process_rows, workload_members


def test_every_synthetic_host_sends_a_snapshot_central_accepts() -> None:
    for host in fleet.HOSTS:
        document = parse_snapshot(json.dumps(fleet.document(host)))
        assert document["host"]["name"] == host.name


def test_a_slurm_job_and_a_container_show_as_workloads() -> None:
    job_host, container_host = fleet.HOSTS[0], fleet.HOSTS[1]
    job_rows = process_rows(fleet.document(job_host))
    assert [row.pid for row in workload_members(job_rows, "slurm_job:4242")] == [41001, 41002]
    container_rows = process_rows(fleet.document(container_host))
    container_id = "c0ffee" * 10 + "beef"
    members = workload_members(container_rows, f"container:{container_id}")
    assert [row.pid for row in members] == [42001]
    assert container_rows[42001].container_id == container_id
