"""What the read side says about hosts: the JSON API's shapes, as read-only serializers.

The queries that load them are named on the models' querysets
(``Host.objects.for_listing()``, ``LatestSnapshot.objects.document_for(host)``,
``host.findings.open()``), shared with the pages so both show the same thing.
The answer and the OpenAPI schema's components both come from these classes
(``gpuadmin.api_schema``). A process is passed through exactly as the probe
sent it (``ProcessAsSent``: the snapshot schema's own definition).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuadmin.api_schema import ProcessAsSent, Shape, TextOrNull, UtcTime
from gpuadmin.fleet.models import Finding, Gpu, Host
from gpuadmin.fleet.process_tree import ZombieTree, gpu_holders, orphans, process_rows, zombie_trees

Severity = Finding.Severity


def open_finding_counts(host: Host) -> dict[str, int]:
    """Counts by severity, from ``Host.objects.for_listing()`` annotations (queried if missing)."""
    if hasattr(host, f"open_findings_{Severity.CRITICAL.value}"):
        return {s.value: getattr(host, f"open_findings_{s.value}") for s in Severity}
    rows = host.findings.open().values("severity").annotate(n=Count("id"))
    by_severity = {row["severity"]: row["n"] for row in rows}
    return {s.value: by_severity.get(s.value, 0) for s in Severity}


def present_gpus(host: Host) -> list[Gpu]:
    gpus = getattr(host, "present_gpus", None)
    if gpus is None:
        gpus = list(host.gpus.filter(present=True).order_by("index"))
    return gpus


class GpuSerializer(Shape):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    name = serializers.CharField()
    memory_total_bytes = serializers.IntegerField(allow_null=True)
    memory_used_bytes = serializers.IntegerField(allow_null=True)
    memory_attributed_bytes = serializers.IntegerField(allow_null=True)
    memory_unattributed_bytes = serializers.IntegerField(allow_null=True)
    utilization_percent = serializers.IntegerField(allow_null=True)


class ProcessCountsSerializer(Shape):
    processes = serializers.IntegerField(allow_null=True, source="process_count")
    zombies = serializers.IntegerField(allow_null=True, source="zombie_count")
    gpu_processes = serializers.IntegerField(allow_null=True, source="gpu_process_count")


class GpuBackendSerializer(Shape):
    """How the agent reads its GPUs (NVML, nvidia-smi), and why not when it cannot."""

    name = TextOrNull(source="gpu_backend_name")
    available = serializers.BooleanField(allow_null=True, source="gpu_backend_available")
    reason = TextOrNull(source="gpu_backend_reason")


# Open findings counted by severity: a key for each of ``Finding.Severity``, 0 included.
OpenFindingsBySeveritySerializer: type[Shape] = type(
    "OpenFindingsBySeveritySerializer", (Shape,),
    {"__module__": __name__, **{s.value: serializers.IntegerField() for s in Severity}},
)


class HostSummarySerializer(Shape):
    """One host as the list endpoint shows it: columns only, no snapshot document."""

    name = serializers.CharField()
    online = serializers.BooleanField(source="is_online")
    first_seen_at = UtcTime(allow_null=True)
    last_seen_at = UtcTime(allow_null=True)
    last_snapshot_taken_at = UtcTime(allow_null=True)
    boot_id = serializers.CharField(allow_null=True)
    kernel = TextOrNull()
    driver_version = TextOrNull()
    pid_max = serializers.IntegerField(allow_null=True)
    pids_in_use = serializers.IntegerField(allow_null=True)
    gpus = serializers.SerializerMethodField()
    counts = ProcessCountsSerializer(source="*")
    open_findings_count = serializers.SerializerMethodField()
    open_findings_by_severity = serializers.SerializerMethodField()
    gpu_backend = GpuBackendSerializer(source="*")
    last_error = TextOrNull()
    last_error_at = UtcTime(allow_null=True)

    @extend_schema_field(GpuSerializer(many=True))
    def get_gpus(self, host: Host) -> Any:
        return GpuSerializer(present_gpus(host), many=True).data

    def get_open_findings_count(self, host: Host) -> int:
        return sum(open_finding_counts(host).values())

    @extend_schema_field(OpenFindingsBySeveritySerializer)
    def get_open_findings_by_severity(self, host: Host) -> dict[str, int]:
        return open_finding_counts(host)


class FindingSerializer(Shape):
    kind = serializers.ChoiceField(Finding.Kind.choices)
    severity = serializers.ChoiceField(Severity.choices)
    title = serializers.CharField()
    remedy = serializers.CharField()
    first_seen_at = UtcTime()
    last_seen_at = UtcTime()
    details = serializers.DictField()


@dataclass
class ProcessesThatMatter:
    """A snapshot's GPU holders, zombie trees and orphans; each process as the probe sent it."""

    as_sent: dict[int, dict[str, Any]] = field(default_factory=dict)
    holders: list[int] = field(default_factory=list)
    trees: list[ZombieTree] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, document: dict[str, Any] | None) -> ProcessesThatMatter:
        if document is None:
            return cls()
        rows = process_rows(document)
        return cls(as_sent={p["pid"]: p for p in document.get("processes", ())},
                   holders=[r.pid for r in gpu_holders(rows)], trees=zombie_trees(rows),
                   orphans=[r.pid for r in orphans(rows)])


class ZombieTreeSerializer(Shape):
    """A parent and the zombies only it can reap (``process_tree.ZombieTree``)."""

    parent_pid = serializers.IntegerField()
    # A declared field is popped off the class (SerializerMetaclass): it does not shadow Field.parent.
    parent = serializers.SerializerMethodField()  # type: ignore[assignment]
    zombie_count = serializers.SerializerMethodField()
    zombies = serializers.SerializerMethodField()

    @extend_schema_field(ProcessAsSent(allow_null=True))
    def get_parent(self, tree: ZombieTree) -> dict[str, Any] | None:
        return self.context["matter"].as_sent.get(tree.parent_pid)

    def get_zombie_count(self, tree: ZombieTree) -> int:
        return len(tree.zombies)

    @extend_schema_field(serializers.ListField(child=ProcessAsSent()))
    def get_zombies(self, tree: ZombieTree) -> list[dict[str, Any]]:
        return [self.context["matter"].as_sent[z.pid] for z in tree.zombies]


class HostDetailSerializer(HostSummarySerializer):
    """One host with its newest snapshot's processes that matter and its open findings."""

    # context: "document" (the newest snapshot, or None) and "findings" (open, most severe first).

    snapshot_taken_at = serializers.SerializerMethodField()
    processes = serializers.SerializerMethodField()
    zombie_trees = serializers.SerializerMethodField()
    orphans = serializers.SerializerMethodField()
    findings = serializers.SerializerMethodField()

    def to_representation(self, instance: Host) -> Any:
        self.context.setdefault("matter", ProcessesThatMatter.of(self.context["document"]))
        return super().to_representation(instance)

    @extend_schema_field(UtcTime(allow_null=True))
    def get_snapshot_taken_at(self, host: Host) -> str | None:
        document = self.context["document"]
        return document.get("taken_at") if document else None

    @extend_schema_field(serializers.ListField(child=ProcessAsSent()))
    def get_processes(self, host: Host) -> list[dict[str, Any]]:
        matter: ProcessesThatMatter = self.context["matter"]
        return [matter.as_sent[pid] for pid in matter.holders]

    @extend_schema_field(ZombieTreeSerializer(many=True))
    def get_zombie_trees(self, host: Host) -> Any:
        return ZombieTreeSerializer(self.context["matter"].trees, many=True, context=self.context).data

    @extend_schema_field(serializers.ListField(child=ProcessAsSent()))
    def get_orphans(self, host: Host) -> list[dict[str, Any]]:
        matter: ProcessesThatMatter = self.context["matter"]
        return [matter.as_sent[pid] for pid in matter.orphans]

    @extend_schema_field(FindingSerializer(many=True))
    def get_findings(self, host: Host) -> Any:
        return FindingSerializer(self.context["findings"], many=True).data
