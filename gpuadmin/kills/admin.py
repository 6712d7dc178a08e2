"""Django admin for kill requests: read-only. Requests change only through the
workflow (services), which keeps the audit log in step; an edit here would not."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from gpuadmin.admin_base import ReadOnlyAdmin
from gpuadmin.kills.models import KillRequest, KillStep, KillTarget


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class KillTargetInline(ReadOnlyInline):
    model = KillTarget
    fields = ["pid", "start_time_ticks", "user", "name", "state", "outcome", "outcome_detail", "last_signal"]


class KillStepInline(ReadOnlyInline):
    model = KillStep
    fields = ["seq", "at", "event", "pid", "signal", "method", "result", "detail"]


@admin.register(KillRequest)
class KillRequestAdmin(ReadOnlyAdmin):
    list_display = [
        "id", "host", "status", "requested_by_name", "approved_by_name", "requested_at", "finished_at"
    ]
    list_filter = ["status", "host"]
    search_fields = ["reason", "requested_by_name", "approved_by_name", "targets__name", "targets__user"]
    inlines = [KillTargetInline, KillStepInline]
