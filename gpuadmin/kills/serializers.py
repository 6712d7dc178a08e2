"""The JSON shapes of kill requests (API): read-only serializers, from which the OpenAPI schema's
components are generated too (``gpuadmin.api_schema``). The API only reads models here; every
change goes through the services."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuadmin.api_schema import Given, OwnerAsSent, Shape, TextOrNull, UtcTime
from gpuadmin.kills.models import KillRequest, KillStep, KillTarget
from gpuadmin.kills.states import Status
from gpuadmin.kills.targets import Preview


def _strings() -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField())


def _bytes_by_gpu() -> serializers.DictField:
    """{GPU uuid: bytes or null}, as the snapshot says it."""
    return serializers.DictField(child=serializers.IntegerField(allow_null=True))


class KillTargetSerializer(Shape):
    pid = serializers.IntegerField()
    start_time_ticks = serializers.IntegerField()
    boot_id = serializers.CharField()
    ppid = serializers.IntegerField(allow_null=True)
    uid = serializers.IntegerField(allow_null=True)
    user = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    cmdline = _strings()
    cmdline_truncated = serializers.BooleanField()
    cmdline_sha256 = serializers.CharField()
    state = serializers.CharField()
    gpu_memory_bytes = _bytes_by_gpu()
    is_descendant = serializers.BooleanField()
    owner = OwnerAsSent(allow_null=True)
    outcome = serializers.ChoiceField(KillTarget.Outcome.choices)
    outcome_detail = serializers.CharField()
    last_signal = TextOrNull()


class KillStepSerializer(Shape):
    seq = serializers.IntegerField()
    at = UtcTime(allow_null=True)
    received_at = UtcTime(allow_null=True)
    event = serializers.ChoiceField(KillStep.Event.choices)
    pid = serializers.IntegerField(allow_null=True)
    signal = TextOrNull()
    method = TextOrNull()
    result = TextOrNull()
    detail = serializers.CharField()


class WorkloadSerializer(Shape):
    """Every process of a Slurm job, container or pod (``fleet.process_tree.Workload``)."""

    key = serializers.CharField()
    # A declared field is popped off the class (SerializerMetaclass): it does not shadow Field.label.
    label = serializers.CharField()  # type: ignore[assignment]


class MemorySerializer(Shape):
    """GPU memory the kill should free, and what the snapshots after it showed freed."""

    expected_release_bytes = serializers.IntegerField(allow_null=True, source="memory_expected_release_bytes")
    released_bytes = serializers.IntegerField(allow_null=True, source="memory_released_bytes")
    confirmed_at = UtcTime(allow_null=True, source="memory_confirmed_at")


class TargetNowSerializer(Shape):
    """A pending request's target against the newest snapshot (``kills.changes.TargetNow``)."""

    pid = serializers.IntegerField(source="target.pid")
    gone = serializers.BooleanField()
    will_be_refused = serializers.BooleanField()
    gpu_memory_now_bytes = serializers.IntegerField(allow_null=True)
    changes = _strings()


class KillRequestSerializer(Shape):
    """A kill request as the list shows it."""

    id = serializers.IntegerField(source="pk")
    status = serializers.ChoiceField(Status.choices)
    final = serializers.BooleanField(source="is_final")
    host = serializers.CharField(source="host.name")
    requested_by = serializers.CharField(source="requested_by_name")
    requested_at = UtcTime()
    reason = serializers.CharField()
    plan = serializers.ListField()
    include_descendants = serializers.BooleanField()
    workload = serializers.SerializerMethodField()
    snapshot_taken_at = UtcTime(allow_null=True)
    boot_id = serializers.CharField()
    warnings = _strings()
    excluded_targets = serializers.ListField()
    pending_expires_at = UtcTime(allow_null=True)
    approved_by = TextOrNull(source="approved_by_name")
    self_approved = serializers.BooleanField()
    sigkill_only_allowed = serializers.BooleanField()
    closed_by = TextOrNull(source="closed_by_name")
    decided_at = UtcTime(allow_null=True)
    decision_reason = serializers.CharField()
    start_deadline = UtcTime(allow_null=True)
    dispatched_at = UtcTime(allow_null=True)
    started_at = UtcTime(allow_null=True)
    finished_at = UtcTime(allow_null=True)
    result_detail = serializers.CharField()
    memory = MemorySerializer(source="*")
    targets = KillTargetSerializer(many=True)

    @extend_schema_field(WorkloadSerializer(allow_null=True))
    def get_workload(self, kill_request: KillRequest) -> dict[str, Any] | None:
        if not kill_request.workload:
            return None
        return WorkloadSerializer({"key": kill_request.workload, "label": kill_request.workload_label}).data


class KillRequestDetailSerializer(KillRequestSerializer):
    """One request (detail, filing, decisions): with its steps and, for a pending one, `targets_now`:
    its targets as the newest snapshot shows them."""

    # targets_now: given by the caller as context["targets_now"] (kills.changes.compare).

    steps = KillStepSerializer(many=True)
    targets_now = Given(child=TargetNowSerializer(), required=False)


class ExcludedSerializer(Shape):
    """A process a request for a workload or with descendants leaves out, and why (``targets.Excluded``)."""

    pid = serializers.IntegerField()
    name = serializers.CharField()
    user = serializers.CharField(allow_null=True)
    why = serializers.CharField()


class ParentOfferSerializer(Shape):
    """For a zombie: the parent that could reap it, offered instead (``targets.ParentOffer``)."""

    pid = serializers.IntegerField()
    start_time_ticks = serializers.IntegerField(allow_null=True)
    name = serializers.CharField()
    user = serializers.CharField(allow_null=True)
    command_line = serializers.CharField()
    state = serializers.CharField()
    zombie_count = serializers.IntegerField()
    refused_because = serializers.CharField(allow_null=True)


class PreviewTargetSerializer(Shape):
    """A process a request would target: its row in the snapshot (``fleet.process_tree.ProcessRow``)."""

    pid = serializers.IntegerField()
    start_time_ticks = serializers.IntegerField()
    ppid = serializers.IntegerField(allow_null=True)
    uid = serializers.IntegerField(allow_null=True)
    user = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    state = serializers.CharField()
    cmdline = _strings()
    gpu_memory_bytes = _bytes_by_gpu()
    owner = OwnerAsSent(allow_null=True)
    is_descendant = serializers.SerializerMethodField()

    def get_is_descendant(self, row: Any) -> bool:
        # The rows come seed first; a workload's processes are all named, none descends.
        preview: Preview = self.context["preview"]
        return row.pid != preview.targets[0].pid and preview.workload is None


class KillPreviewSerializer(Shape):
    """What a request would target, without filing it (``kills.targets.Preview``)."""

    host = serializers.CharField(source="host_name")
    snapshot_taken_at = UtcTime(allow_null=True)
    boot_id = serializers.CharField(allow_null=True)
    ok = serializers.BooleanField()
    refusal = serializers.CharField(allow_null=True)
    parent_offer = ParentOfferSerializer(allow_null=True)
    warnings = _strings()
    workload = WorkloadSerializer(allow_null=True)
    targets = PreviewTargetSerializer(many=True)
    excluded = ExcludedSerializer(many=True)


def preview_data(preview: Preview) -> Any:
    return KillPreviewSerializer(preview, context={"preview": preview}).data
