"""``/metrics``: the fleet in the Prometheus text format, for the monitoring a lab already runs.

Nothing is counted in process memory: gunicorn runs several workers, and each
would count only what it served. Every scrape reads the database instead, through
one collector with a fixed number of queries however many hosts there are
(``SCRAPE_QUERIES``).

Labels stay bounded: host, GPU index / uuid / model name, finding kind and
severity, kill request status. Never a PID, user or command line: each would
make a new series per process, and carry text anyone on a GPU host can choose
into the lab's time-series database.

Access: ``Authorization: Bearer $GPUADMIN_METRICS_TOKEN``. With no token
configured the endpoint does not exist (404), so a fresh install exposes
nothing; a missing or wrong token is answered 401.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Case, CharField, Count, Exists, F, OuterRef, Subquery, Value, When
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuadmin.fleet.models import Finding, Gpu, Host, HostSample, SnapshotRejection
from gpuadmin.kills.models import KillRequest

# Rejected snapshots whose host name is not a known host (or could not be read):
# counted together, so junk sent under made-up names cannot add series.
UNKNOWN_HOST_LABEL = "(unknown)"
GPU_LABELS = ["host", "gpu", "uuid", "name"]
# Hosts, GPUs, open findings, kill requests, rejections: one query each.
SCRAPE_QUERIES = 5


class FleetCollector:
    """Builds every metric from the database when the registry is collected."""

    def collect(self) -> Iterator[Metric]:
        yield from self._hosts()
        yield from self._gpus()
        yield self._open_findings()
        yield self._kill_requests()
        yield self._rejections()

    def _hosts(self) -> Iterator[Metric]:
        online = GaugeMetricFamily(
            "gpuadmin_host_online", "1 if the host's last snapshot arrived within 3 probe intervals.",
            labels=["host"],
        )
        age = GaugeMetricFamily(
            "gpuadmin_host_last_snapshot_age_seconds",
            "Seconds since central stored the host's last snapshot (central's clock).", labels=["host"],
        )
        zombies = GaugeMetricFamily(
            "gpuadmin_host_zombie_processes", "Zombie processes in the host's last snapshot.", labels=["host"]
        )
        uninterruptible = GaugeMetricFamily(
            "gpuadmin_host_uninterruptible_processes",
            "Processes in D state (uninterruptible sleep) in the host's last snapshot.", labels=["host"],
        )
        # Host has no D-state column; its newest history row has the count.
        newest_sample = HostSample.objects.filter(host=OuterRef("pk")).order_by("-taken_at")
        hosts = Host.objects.fleet().only("name", "last_seen_at", "zombie_count").annotate(
            uninterruptible_count=Subquery(newest_sample.values("uninterruptible_count")[:1])
        )
        now = timezone.now()
        for host in hosts:
            online.add_metric([host.name], 1.0 if host.is_online else 0.0)
            if host.last_seen_at is None:
                continue  # never sent a snapshot: no age, no counts
            age.add_metric([host.name], max(0.0, (now - host.last_seen_at).total_seconds()))
            zombies.add_metric([host.name], host.zombie_count)
            if host.uninterruptible_count is not None:
                uninterruptible.add_metric([host.name], host.uninterruptible_count)
        yield from (online, age, zombies, uninterruptible)

    def _gpus(self) -> Iterator[Metric]:
        help_suffix = " (last snapshot; GPUs no longer listed are left out)."
        total = GaugeMetricFamily("gpuadmin_gpu_memory_total_bytes", "GPU memory size" + help_suffix,
                                  labels=GPU_LABELS)
        used = GaugeMetricFamily("gpuadmin_gpu_memory_used_bytes", "GPU memory in use" + help_suffix,
                                 labels=GPU_LABELS)
        attributed = GaugeMetricFamily(
            "gpuadmin_gpu_memory_attributed_bytes",
            "GPU memory held by processes visible on the host" + help_suffix, labels=GPU_LABELS,
        )
        unattributed = GaugeMetricFamily(
            "gpuadmin_gpu_memory_unattributed_bytes",
            "GPU memory in use that no visible process accounts for" + help_suffix, labels=GPU_LABELS,
        )
        utilization = GaugeMetricFamily("gpuadmin_gpu_utilization_percent",
                                        "GPU utilisation, 0-100" + help_suffix, labels=GPU_LABELS)
        gpus = Gpu.objects.filter(present=True).select_related("host").only(
            "host__name", "index", "uuid", "name", "memory_total_bytes", "memory_used_bytes",
            "memory_attributed_bytes", "utilization_percent",
        )
        for gpu in gpus:
            labels = [gpu.host.name, str(gpu.index), gpu.uuid, gpu.name]
            if gpu.memory_total_bytes is not None:
                total.add_metric(labels, gpu.memory_total_bytes)
            attributed.add_metric(labels, gpu.memory_attributed_bytes)
            # Unknown use means unknown unattributed memory, not zero.
            if gpu.memory_used_bytes is not None:
                used.add_metric(labels, gpu.memory_used_bytes)
                unattributed.add_metric(labels, gpu.memory_unattributed_bytes)
            if gpu.utilization_percent is not None:
                utilization.add_metric(labels, gpu.utilization_percent)
        yield from (total, used, attributed, unattributed, utilization)

    def _open_findings(self) -> Metric:
        family = GaugeMetricFamily("gpuadmin_findings_open", "Open findings, by host, kind and severity.",
                                   labels=["host", "kind", "severity"])
        # order_by(): Finding's default ordering would otherwise join the GROUP BY.
        rows = (
            Finding.objects.open().order_by()
            .values_list("host__name", "kind", "severity").annotate(n=Count("id"))
        )
        for host_name, kind, severity, count in rows:
            family.add_metric([host_name, kind, severity], count)
        return family

    def _kill_requests(self) -> Metric:
        family = GaugeMetricFamily(
            "gpuadmin_kill_requests", "Kill requests, by status (every status listed).", labels=["status"]
        )
        counts = dict(KillRequest.objects.order_by().values_list("status").annotate(n=Count("id")))
        for status in KillRequest.Status:
            family.add_metric([status.value], counts.get(status.value, 0))
        return family

    def _rejections(self) -> Metric:
        family = CounterMetricFamily(
            "gpuadmin_snapshot_rejections",
            f"Snapshots central refused, by host ({UNKNOWN_HOST_LABEL}: no known host name).",
            labels=["host"],
        )
        known_host = Exists(Host.objects.filter(name=OuterRef("host_name")))
        label = Case(When(known_host, then=F("host_name")), default=Value(UNKNOWN_HOST_LABEL),
                     output_field=CharField())
        rows = SnapshotRejection.objects.order_by().annotate(label=label).values_list("label").annotate(
            n=Count("id")
        )
        for host_label, count in rows:
            family.add_metric([host_label], count)
        return family


def render_metrics() -> bytes:
    """One scrape's text: a registry per scrape, so nothing is shared between requests."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return generate_latest(registry)


def _bearer_token(request: HttpRequest) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    expected = settings.GPUADMIN_METRICS_TOKEN
    if not expected:
        raise Http404("metrics are off: GPUADMIN_METRICS_TOKEN is not set")
    # Constant-time comparison: the token is the only thing guarding the endpoint.
    if not hmac.compare_digest(_bearer_token(request).encode(), expected.encode()):
        response = HttpResponse("a valid bearer token is required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="gpuadmin metrics"'
        return response
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE_LATEST)
