"""Django admin for the fleet: a read-only window on what the agents reported.

Everything here is written by ingest; editing it by hand would make the panel
disagree with the hosts, so the admin only shows. Deleting is allowed where it
has a meaning: a decommissioned host (with its history) and old rejections.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from gpuadmin.admin_base import ReadOnlyAdmin
from gpuadmin.fleet.models import (
    Finding,
    Gpu,
    GpuSample,
    Host,
    HostSample,
    LatestSnapshot,
    ProcessLife,
    SnapshotRejection,
)


class DeletableAdmin(ReadOnlyAdmin):
    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return admin.ModelAdmin.has_delete_permission(self, request, obj)


@admin.register(Host)
class HostAdmin(DeletableAdmin):
    list_display = [
        "name",
        "online",
        "last_seen_at",
        "gpu_backend_name",
        "gpu_backend_available",
        "process_count",
        "gpu_process_count",
        "zombie_count",
        "pids_in_use",
        "pid_max",
        "last_error_at",
    ]
    list_filter = ["gpu_backend_name", "gpu_backend_available"]
    search_fields = ["name", "kernel", "driver_version"]

    @admin.display(boolean=True, description="Online")
    def online(self, host: Host) -> bool:
        return host.is_online


@admin.register(Gpu)
class GpuAdmin(ReadOnlyAdmin):
    list_display = [
        "host",
        "index",
        "name",
        "uuid",
        "memory_used_bytes",
        "memory_attributed_bytes",
        "memory_total_bytes",
        "utilization_percent",
        "present",
        "updated_at",
    ]
    list_filter = ["present", "host"]
    search_fields = ["host__name", "uuid", "name"]


@admin.register(LatestSnapshot)
class LatestSnapshotAdmin(ReadOnlyAdmin):
    list_display = ["host", "taken_at", "received_at"]
    search_fields = ["host__name"]
    exclude = ["document"]
    readonly_fields = ["document_json"]

    @admin.display(description="Document")
    def document_json(self, snapshot: LatestSnapshot) -> str:
        # Indented, and ASCII only: what processes named themselves (controls, bidi overrides)
        # shows as \u escapes, and format_html escapes the markup.
        return format_html("<pre>{}</pre>", json.dumps(snapshot.document, indent=1, ensure_ascii=True))


@admin.register(GpuSample)
class GpuSampleAdmin(ReadOnlyAdmin):
    list_display = ["gpu", "taken_at", "memory_used_bytes", "memory_attributed_bytes", "utilization_percent"]
    list_select_related = ["gpu__host"]
    date_hierarchy = "taken_at"


@admin.register(HostSample)
class HostSampleAdmin(ReadOnlyAdmin):
    list_display = [
        "host",
        "taken_at",
        "process_count",
        "zombie_count",
        "uninterruptible_count",
        "pids_in_use",
        "pid_max",
    ]
    list_select_related = ["host"]
    date_hierarchy = "taken_at"


@admin.register(ProcessLife)
class ProcessLifeAdmin(ReadOnlyAdmin):
    list_display = [
        "host",
        "pid",
        "user",
        "name",
        "last_state",
        "peak_gpu_memory_bytes",
        "held_device",
        "was_zombie",
        "was_orphaned",
        "first_seen_at",
        "last_seen",
        "gone_at",
    ]
    list_filter = ["was_zombie", "was_orphaned", "held_device", "host"]
    list_select_related = ["host"]
    search_fields = ["host__name", "user", "name", "=pid"]

    @admin.display(description="Last seen", ordering="last_seen_at")
    def last_seen(self, life: ProcessLife) -> datetime:
        return life.latest_sighting_at()  # an open life's stored last_seen_at is when it was last written


@admin.register(Finding)
class FindingAdmin(ReadOnlyAdmin):
    list_display = ["host", "kind", "severity", "title", "first_seen_at", "last_seen_at", "resolved_at"]
    list_filter = ["kind", "severity", "host"]
    list_select_related = ["host"]
    search_fields = ["host__name", "title"]


@admin.register(SnapshotRejection)
class SnapshotRejectionAdmin(DeletableAdmin):
    list_display = ["host_name", "received_at", "size_bytes", "error"]
    search_fields = ["host_name", "error"]
    date_hierarchy = "received_at"
