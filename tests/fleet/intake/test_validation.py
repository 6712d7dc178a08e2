"""parse_snapshot: what central refuses, and that the refusal says why in words an admin can act on."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from gpuadmin.fleet.intake.validation import (
    PID_MAX_LIMIT,
    host_name_from_text,
    json_path,
    parse_snapshot,
    supported_schema_versions,
)
from gpuadmin.probe.snapshot import SCHEMA_VERSION
from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import NOW, good, rejection


def test_a_valid_snapshot_comes_back_as_the_same_document() -> None:
    document = good(processes=[proc(4120, gpu_memory={"GPU-sim-0000": 2 * GiB})], gpus=[gpu(0, used=3 * GiB)])
    assert parse_snapshot(json.dumps(document), now=NOW) == document
    assert parse_snapshot(json.dumps(document).encode(), now=NOW) == document


def test_oversized_is_refused_before_parsing_and_names_the_limit_and_host() -> None:
    document = good(processes=[proc(p) for p in range(2, 40)])
    text = json.dumps(document)
    with override_settings(GPUADMIN_SNAPSHOT_MAX_BYTES=len(text) - 1):
        error = rejection(text)
        assert "over the limit" in error.message
        assert "GPUADMIN_SNAPSHOT_MAX_BYTES" in error.message
        assert error.host_name == "gpu07"
        # Truncated garbage of the same size is still refused for its size, not parsed.
        garbage = text[:-200] + "x" * 200
        assert "over the limit" in rejection(garbage).message
    with override_settings(GPUADMIN_SNAPSHOT_MAX_BYTES=len(text)):
        assert parse_snapshot(text, now=NOW)["host"]["name"] == "gpu07"


def test_size_counts_utf8_bytes_not_characters() -> None:
    text = json.dumps(good(processes=[proc(2, cmdline=["é" * 100])]), ensure_ascii=False)
    with override_settings(GPUADMIN_SNAPSHOT_MAX_BYTES=len(text) + 50):
        assert "over the limit" in rejection(text).message


def test_not_json_says_where_and_keeps_the_host_name() -> None:
    text = json.dumps(good())[:-40]
    error = rejection(text)
    assert error.message.startswith("snapshot is not valid JSON:")
    assert "line 1 column" in error.message
    assert error.host_name == "gpu07"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ("[1, 2]", "must be a JSON object, got an array"),
        ('"text"', "must be a JSON object, got a string"),
        ("null", "must be a JSON object, got null"),
        (b"\xff\xfe{}", "not UTF-8"),
        ('{"schema_version": NaN}', "NaN is not a JSON number"),
        ('{"schema_version": 1e400}', "does not fit a 64-bit float"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ({"schema_version": 1}, "must arrive as JSON text, got a dict"),
    ],
)
def test_payloads_that_are_not_a_json_object(payload: Any, words: str) -> None:
    assert words in rejection(payload).message


@pytest.mark.parametrize(("version", "shown"), [
    (3, "3"), (0, "0"), ("1", '"1"'), (True, "true"), (1.0, "1.0"), (2.0, "2.0"),
])
def test_wrong_schema_version_names_the_supported_ones(version: Any, shown: str) -> None:
    document = good()
    document["schema_version"] = version
    error = rejection(json.dumps(document))
    assert error.message.startswith(f"schema_version {shown} is not supported")
    assert "accepts schema_version 1 or 2;" in error.message
    assert error.host_name == "gpu07"


def test_the_supported_versions_are_the_schemas_and_the_probe_writes_the_newest() -> None:
    assert supported_schema_versions() == (1, 2)
    assert max(supported_schema_versions()) == SCHEMA_VERSION


def v1_document() -> dict[str, Any]:
    """What an agent not yet upgraded sends: version 1, processes without an owner."""
    document = good(processes=[proc(4120, gpu_memory={"GPU-sim-0000": 2 * GiB})], gpus=[gpu(0, used=3 * GiB)])
    document["schema_version"] = 1
    for process in document["processes"]:
        del process["owner"]
    return document


def test_a_version_1_snapshot_is_still_accepted() -> None:
    document = v1_document()
    assert parse_snapshot(json.dumps(document), now=NOW) == document


def test_version_2_needs_every_process_to_say_its_owner() -> None:
    document = good(processes=[proc(4120), proc(4121)])
    del document["processes"][1]["owner"]
    assert rejection(json.dumps(document)).message == "processes[1]: 'owner' is a required property"


@pytest.mark.parametrize("owner", [
    {"kind": "slurm_job", "job_id": "4242", "step": "batch", "uid": 1000},
    {"kind": "container", "runtime": "docker", "container_id": "a" * 64, "container_name": "<b>x",
     "image": "pytorch/pytorch:2.3"},
    {"kind": "kubernetes_pod", "runtime": None, "pod_uid": "0c9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a",
     "qos_class": "besteffort", "namespace": "ml", "pod_name": "bert-0", "container_id": "b" * 64,
     "container_name": "bert", "image": None},
    {"kind": "login_session", "session_id": "3", "uid": 1000, "unit": "session-3.scope"},
    {"kind": "user_service", "unit": "app-firefox.scope", "uid": 1000},
    {"kind": "system_service", "unit": "jupyterhub.service"},
])
def test_owners_of_every_kind_are_accepted(owner: dict[str, Any]) -> None:
    document = good(processes=[proc(4120, owner=owner)])
    assert parse_snapshot(json.dumps(document), now=NOW)["processes"][0]["owner"] == owner


@pytest.mark.parametrize(("owner", "message"), [
    ({"kind": "vm"}, "processes[0].owner.kind: 'vm' is not one of ['slurm_job', 'container', "),
    ({"kind": "container", "container_id": "not-hex"}, "processes[0].owner"),
    ({"kind": "container", "runtime": "lxc"}, "processes[0].owner"),
    ({"kind": "slurm_job", "job_id": "1", "secret": "x"}, "processes[0].owner"),
])
def test_a_malformed_owner_is_refused(owner: dict[str, Any], message: str) -> None:
    assert rejection(json.dumps(good(processes=[proc(4120, owner=owner)]))).message.startswith(message)


def test_missing_schema_version() -> None:
    document = good()
    del document["schema_version"]
    assert rejection(json.dumps(document)).message.startswith("schema_version missing is not supported")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["processes"][3].update(pid=-1), "processes[3].pid: -1 is less than the minimum of 1"),
        (lambda d: d["processes"][0].update(pid=1.0), "processes[0].pid: 1.0 is not of type 'integer'"),
        (lambda d: d["host"].pop("boot_id"), "host: 'boot_id' is a required property"),
        (
            lambda d: d.update(extra=1),
            "snapshot: Additional properties are not allowed ('extra' was unexpected)",
        ),
        (
            lambda d: d["gpus"][0].update(utilization_percent=101),
            "gpus[0].utilization_percent: 101 is greater",
        ),
        (
            lambda d: d["processes"][1]["gpu_memory_bytes"].update({"GPU-sim-0000": -5}),
            'processes[1].gpu_memory_bytes["GPU-sim-0000"]: -5 is less than the minimum of 0',
        ),
        (lambda d: d["processes"][2].update(state="ZZ"), "processes[2].state: 'ZZ' does not match"),
        (lambda d: d["host"].update(name="../etc"), "host.name: '../etc' does not match"),
    ],
)
def test_schema_violations_name_the_json_path(change: Any, message: str) -> None:
    document = good(processes=[proc(p) for p in (10, 11, 12, 13)])
    change(document)
    assert rejection(json.dumps(document)).message.startswith(message)


def test_long_schema_messages_are_clipped() -> None:
    document = good(processes=[proc(10)])
    document["processes"][0]["name"] = "x" * 5000
    message = rejection(json.dumps(document)).message
    assert message.startswith("processes[0].name: 'xxx")
    assert message.endswith("…")
    assert len(message) < 400


def test_duplicate_pid() -> None:
    document = good(processes=[proc(10), proc(11), proc(10, start=5)])
    assert rejection(json.dumps(document)).message == (
        "processes[2].pid: pid 10 is listed twice (also processes[0])"
    )


def test_duplicate_gpu_uuid_and_index() -> None:
    document = good(gpus=[gpu(0), gpu(1, uuid="GPU-sim-0000")])
    assert rejection(json.dumps(document)).message.startswith(
        'gpus[1].uuid: GPU "GPU-sim-0000" is listed twice'
    )
    document = good(gpus=[gpu(0), gpu(0, uuid="GPU-other")])
    assert rejection(json.dumps(document)).message.startswith("gpus[1].index: GPU index 0 is listed twice")


def test_memory_on_a_gpu_that_is_not_listed() -> None:
    document = good(processes=[proc(10, gpu_memory={"GPU-ghost": GiB})])
    assert rejection(json.dumps(document)).message == (
        'processes[0].gpu_memory_bytes: GPU "GPU-ghost" is not in gpus'
    )
    document = good(unmatched=[{"pid": 99, "gpu_uuid": "GPU-ghost", "used_memory_bytes": GiB}])
    assert rejection(json.dumps(document)).message.startswith("unmatched_gpu_processes[0].gpu_uuid")


def test_per_process_utilisation_is_optional_and_keyed_by_listed_gpus_with_whole_percents() -> None:
    measured = proc(10, gpu_memory={"GPU-sim-0000": GiB}, gpu_utilization_percent={"GPU-sim-0000": 100})
    document = good(processes=[measured, proc(11, gpu_utilization_percent={"GPU-sim-0000": 0})])
    assert parse_snapshot(json.dumps(document), now=NOW) == document
    ghost = good(processes=[proc(10, gpu_utilization_percent={"GPU-sim-0000": 5, "GPU-ghost": 5})])
    assert rejection(json.dumps(ghost)).message == (
        'processes[0].gpu_utilization_percent: GPU "GPU-ghost" is not in gpus'
    )
    for value in (101, -1, 50.5, None, "50"):
        odd = good(processes=[proc(10, gpu_utilization_percent={"GPU-sim-0000": value})])
        assert rejection(json.dumps(odd)).message.startswith(
            'processes[0].gpu_utilization_percent["GPU-sim-0000"]'), value


def test_taken_at_more_than_five_minutes_ahead_of_central() -> None:
    ahead = good(taken_at=NOW + timedelta(minutes=5, seconds=1))
    message = rejection(json.dumps(ahead)).message
    assert message.startswith("taken_at: ")
    assert "ahead of central's clock" in message
    assert "NTP" in message
    almost = good(taken_at=NOW + timedelta(minutes=4, seconds=59))
    assert parse_snapshot(json.dumps(almost), now=NOW)["taken_at"] == almost["taken_at"]


def test_taken_at_older_than_anything_central_keeps(settings: Any) -> None:
    settings.GPUADMIN_HISTORY_DAYS = 90
    long_ago = good(taken_at=NOW - timedelta(days=90, seconds=1))
    year_one = {**good(), "taken_at": "0001-01-01T00:00:00.000000Z"}  # near datetime.min
    for document in (long_ago, year_one):
        message = rejection(json.dumps(document)).message
        assert message.startswith("taken_at: ")
        assert "older than anything central keeps (GPUADMIN_HISTORY_DAYS = 90)" in message
        assert "before central's clock" in message
    kept = good(taken_at=NOW - timedelta(days=90))
    assert parse_snapshot(json.dumps(kept), now=NOW)["taken_at"] == kept["taken_at"]


def test_taken_at_that_is_no_date() -> None:
    document = good()
    document["taken_at"] = "2026-13-45T10:00:00Z"
    assert (
        'taken_at: "2026-13-45T10:00:00Z" is not a valid date and time'
        in rejection(json.dumps(document)).message
    )


def test_numbers_too_big_for_the_database() -> None:
    document = good(processes=[proc(10)])
    document["processes"][0]["rss_bytes"] = 2**70
    assert rejection(json.dumps(document)).message == (
        f"processes[0].rss_bytes: {2**70} is larger than a 64-bit integer"
    )
    document = good(processes=[proc(PID_MAX_LIMIT + 1)])
    assert (
        "processes[0].pid: 4194305 is greater than Linux's PID_MAX_LIMIT"
        in rejection(json.dumps(document)).message
    )
    document = good(processes=[proc(10, uid=2**31)])
    assert rejection(json.dumps(document)).message.startswith("processes[0].uid: 2147483648 is greater")


def test_text_postgresql_cannot_store() -> None:
    document = good(processes=[proc(10, cmdline=["python", "a\x00b"])])
    assert rejection(json.dumps(document)).message == "processes[0].cmdline[1]: contains a NUL character"
    text = json.dumps(good(processes=[proc(10, name="py")])).replace('"name": "py"', '"name": "\\ud800"')
    assert (
        rejection(text).message
        == "processes[0].name: contains a lone UTF-16 surrogate, not valid Unicode text"
    )


def test_hostile_text_is_accepted_as_data() -> None:
    hostile = ["python", "<script>alert(1)</script>", "\x1b[31mred", "\u202eevil"]
    document = good(processes=[proc(10, cmdline=hostile)])
    assert parse_snapshot(json.dumps(document), now=NOW)["processes"][0]["cmdline"] == hostile


def test_host_name_from_text_is_best_effort() -> None:
    assert (
        host_name_from_text('{"schema_version": 1, "host": {"boot_id": "x", "name": "gpu-3.lab"')
        == "gpu-3.lab"
    )
    assert host_name_from_text(b'{"host": {"name": "<script>"}}') == ""
    assert host_name_from_text("not json at all") == ""


def test_json_path() -> None:
    assert json_path([]) == "snapshot"
    assert json_path(["processes", 3, "pid"]) == "processes[3].pid"
    assert (
        json_path(["processes", 0, "gpu_memory_bytes", "GPU-1"]) == 'processes[0].gpu_memory_bytes["GPU-1"]'
    )


def mig_snapshot(instance_gpu: str = "GPU-sim-0000") -> dict[str, Any]:
    parent = gpu(0, used=12 * GiB)
    parent["mig_instances"] = [{"uuid": "MIG-1", "name": "A100 MIG 1g.10gb", "gpu_instance_id": 1,
                                "compute_instance_id": 0, "memory_total_bytes": 10 * GiB,
                                "memory_used_bytes": 3 * GiB}]
    on_instance = {"gpu_uuid": instance_gpu, "gpu_instance_id": 1, "compute_instance_id": 0,
                   "used_memory_bytes": None}
    return good(
        gpus=[parent],
        processes=[proc(4120, gpu_memory={"GPU-sim-0000": None}, mig_instances=[on_instance])],
        unmatched=[{"pid": 99, "gpu_uuid": "GPU-sim-0000", "used_memory_bytes": None, "gpu_instance_id": 1,
                    "compute_instance_id": 0}],
    )


def test_mig_instances_are_accepted_and_stay_optional() -> None:
    document = mig_snapshot()
    assert parse_snapshot(json.dumps(document), now=NOW) == document
    plain = good(processes=[proc(4120, gpu_memory={"GPU-sim-0000": GiB})])  # as agents before MIG sent them
    assert parse_snapshot(json.dumps(plain), now=NOW) == plain


def test_a_mig_instance_of_a_gpu_that_is_not_listed() -> None:
    assert rejection(json.dumps(mig_snapshot("GPU-ghost"))).message == (
        'processes[0].mig_instances[0].gpu_uuid: GPU "GPU-ghost" is not in gpus'
    )
