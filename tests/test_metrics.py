"""/metrics: scraped with the test client, read back with Prometheus's own parser,
and checked against what central stored through the real ingest and kill services."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from gpuadmin.fleet.intake.validation import SnapshotRejected
from gpuadmin.fleet.models import Finding, Gpu
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.metrics import SCRAPE_QUERIES, UNKNOWN_HOST_LABEL
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver

TOKEN = "metrics-token-for-tests-0123456789"
HOSTILE_ARGV = ["python", "--run", 'x"} 1\n# HELP evil', "--user=pid_4242"]
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana-dashboard.json"
BOUNDED_LABELS = {"host", "gpu", "uuid", "name", "kind", "severity", "status"}


@pytest.fixture
def metrics_token(settings) -> str:
    settings.GPUADMIN_METRICS_TOKEN = TOKEN
    return TOKEN


def ingest(document: dict, *, received_ago: timedelta) -> None:
    received_at = timezone.now() - received_ago
    document["taken_at"] = (received_at - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    deliver(json.dumps(document), received_at=received_at)


def reject(payload: str) -> None:
    with pytest.raises(SnapshotRejected):
        deliver(payload, accept_key=False)


@pytest.fixture
def fleet(db: None, requester, approver) -> None:
    """gpu01 online (a GPU holder, unattributed memory, two zombies, one D state); gpu02 offline."""
    ingest(snapshot("gpu01", gpus=[gpu(0, used=30 * GiB, utilization_percent=55, name="Simulated H100"),
                                   gpu(1, used=GiB, utilization_percent=None)],
                    processes=[
                        proc(500, gpu_memory={"GPU-sim-0000": 20 * GiB}, cmdline=HOSTILE_ARGV),
                        proc(600, name="launcher"),
                        proc(601, ppid=600, state="Z", cmdline=[]),
                        proc(602, ppid=600, state="Z", cmdline=[]),
                        proc(700, state="D", gpu_memory={"GPU-sim-0001": GiB}),
                    ]),
           received_ago=timedelta(seconds=2))
    ingest(snapshot("gpu02", gpus=[gpu(0, uuid="GPU-other-0", used=0)]), received_ago=timedelta(hours=2))
    # Refused snapshots: one names a known host, two do not.
    document = snapshot("gpu01")
    document["schema_version"] = 99
    reject(json.dumps(document))
    reject(json.dumps(snapshot("intruder", gpus=[gpu(0), gpu(0)])))
    reject("not json at all")
    # Two kill requests: one left pending, one rejected.
    pending = services.file_request(requester, host="gpu01", pid=500, start_time_ticks=50000,
                                    reason="the job ended, memory stayed")
    rejected = services.file_request(requester, host="gpu01", pid=700, start_time_ticks=70000,
                                     reason="stuck since Monday")
    services.reject(rejected.pk, approver, "it is bob's, ask him first")
    assert KillRequest.objects.get(pk=pending.pk).status == KillRequest.Status.PENDING


def scrape(token: str = TOKEN) -> dict[str, dict[tuple, float]]:
    """Each sample's name -> {labels as sorted tuple: value}, parsed by Prometheus's parser."""
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def labels(**kwargs: str) -> tuple:
    return tuple(sorted(kwargs.items()))


def gpu_labels(host: str, index: int, uuid: str, name: str = "Simulated H100") -> tuple:
    return labels(host=host, gpu=str(index), uuid=uuid, name=name)


# --- access ----------------------------------------------------------------------


@pytest.mark.django_db
def test_without_a_configured_token_the_endpoint_does_not_exist(settings) -> None:
    settings.GPUADMIN_METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 404
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 404


@pytest.mark.django_db
def test_a_missing_token_is_refused_with_a_bearer_challenge(metrics_token: str) -> None:
    response = Client().get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"gpuadmin_" not in response.content


@pytest.mark.django_db
@pytest.mark.parametrize("header", [
    "Bearer wrong-token",
    f"Bearer {TOKEN}x",
    f"Token {TOKEN}",  # the API's scheme is not this endpoint's
    TOKEN,
])
def test_a_wrong_token_is_refused(metrics_token: str, header: str) -> None:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert b"gpuadmin_" not in response.content


@pytest.mark.django_db
def test_the_right_token_gets_the_metrics_and_no_cache(metrics_token: str) -> None:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert b"# TYPE gpuadmin_kill_requests gauge" in response.content
    assert "no-cache" in response["Cache-Control"]


# --- content -----------------------------------------------------------------------


def test_gpu_memory_and_utilization_match_the_stored_gpus(fleet: None, metrics_token: str) -> None:
    samples = scrape()
    gpu0 = gpu_labels("gpu01", 0, "GPU-sim-0000")
    assert samples["gpuadmin_gpu_memory_total_bytes"][gpu0] == 80 * GiB
    assert samples["gpuadmin_gpu_memory_used_bytes"][gpu0] == 30 * GiB
    assert samples["gpuadmin_gpu_memory_attributed_bytes"][gpu0] == 20 * GiB
    assert samples["gpuadmin_gpu_memory_unattributed_bytes"][gpu0] == 10 * GiB
    assert samples["gpuadmin_gpu_utilization_percent"][gpu0] == 55
    gpu1 = gpu_labels("gpu01", 1, "GPU-sim-0001")
    assert samples["gpuadmin_gpu_memory_unattributed_bytes"][gpu1] == 0
    assert gpu1 not in samples["gpuadmin_gpu_utilization_percent"]  # not reported by the GPU: no sample
    # Every present GPU, and nothing else, with the stored numbers.
    stored = {
        gpu_labels(g.host.name, g.index, g.uuid, g.name): (g.memory_used_bytes, g.memory_attributed_bytes)
        for g in Gpu.objects.filter(present=True).select_related("host")
    }
    assert len(stored) == 3
    assert {
        key: (value, samples["gpuadmin_gpu_memory_attributed_bytes"][key])
        for key, value in samples["gpuadmin_gpu_memory_used_bytes"].items()
    } == stored


def test_hosts_online_age_zombies_and_d_state(fleet: None, metrics_token: str) -> None:
    samples = scrape()
    assert samples["gpuadmin_host_online"] == {labels(host="gpu01"): 1, labels(host="gpu02"): 0}
    ages = samples["gpuadmin_host_last_snapshot_age_seconds"]
    assert 2 <= ages[labels(host="gpu01")] < 3600
    assert ages[labels(host="gpu02")] >= 2 * 3600
    assert samples["gpuadmin_host_zombie_processes"] == {labels(host="gpu01"): 2, labels(host="gpu02"): 0}
    assert samples["gpuadmin_host_uninterruptible_processes"] == {
        labels(host="gpu01"): 1, labels(host="gpu02"): 0
    }


def test_open_findings_by_host_kind_and_severity(fleet: None, metrics_token: str) -> None:
    samples = scrape()["gpuadmin_findings_open"]
    expected: dict[tuple, float] = defaultdict(float)
    for finding in Finding.objects.filter(resolved_at__isnull=True).select_related("host"):
        expected[labels(host=finding.host.name, kind=finding.kind, severity=finding.severity)] += 1
    assert samples == expected
    kinds = {dict(key)["kind"] for key in samples}
    assert {Finding.Kind.ZOMBIES, Finding.Kind.UNATTRIBUTED_MEMORY} <= kinds


def test_a_resolved_finding_is_not_counted(fleet: None, metrics_token: str) -> None:
    before = sum(scrape()["gpuadmin_findings_open"].values())
    Finding.objects.filter(kind=Finding.Kind.ZOMBIES).update(resolved_at=timezone.now())
    assert sum(scrape()["gpuadmin_findings_open"].values()) == before - 1


def test_kill_requests_by_status_list_every_status(fleet: None, metrics_token: str) -> None:
    samples = scrape()["gpuadmin_kill_requests"]
    assert samples == {
        labels(status=status.value): {"pending": 1, "rejected": 1}.get(status.value, 0)
        for status in KillRequest.Status
    }


def test_rejections_count_per_known_host_and_lump_the_rest(fleet: None, metrics_token: str) -> None:
    samples = scrape()["gpuadmin_snapshot_rejections_total"]
    assert samples == {labels(host="gpu01"): 1, labels(host=UNKNOWN_HOST_LABEL): 2}


def test_labels_are_bounded_and_carry_no_process_text(fleet: None, metrics_token: str) -> None:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    text = response.content.decode()
    assert "--run" not in text and "evil" not in text and "pid_4242" not in text
    families = list(text_string_to_metric_families(text))
    label_names = {name for family in families for sample in family.samples for name in sample.labels}
    assert label_names <= BOUNDED_LABELS


def test_a_scrape_costs_the_same_queries_for_two_hosts_or_twelve(
    fleet: None, metrics_token: str, django_assert_num_queries
) -> None:
    with django_assert_num_queries(SCRAPE_QUERIES):
        scrape()
    for number in range(3, 13):
        gpus = [gpu(0, uuid=f"GPU-{number}-0"), gpu(1, uuid=f"GPU-{number}-1")]
        ingest(snapshot(f"gpu{number:02d}", gpus=gpus, processes=[proc(900, state="Z", ppid=1)]),
               received_ago=timedelta(seconds=5))
    with django_assert_num_queries(SCRAPE_QUERIES):
        samples = scrape()
    assert len(samples["gpuadmin_host_online"]) == 12
    assert len(samples["gpuadmin_gpu_memory_used_bytes"]) == 3 + 20


def test_the_example_grafana_dashboard_uses_only_exported_metrics(fleet: None, metrics_token: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {name for expr in expressions for name in re.findall(r"\bgpuadmin_[a-z_]+", expr)}
    exported = set(scrape())
    assert used and used <= exported, used - exported
    # Every family is on the dashboard except the GPU's size, which only scales the others.
    families = {name.removesuffix("_total") for name in exported}
    assert families - {name.removesuffix("_total") for name in used} == {"gpuadmin_gpu_memory_total_bytes"}
