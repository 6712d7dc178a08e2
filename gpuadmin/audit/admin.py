"""The Django admin may look at audit events, never add, change or delete them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from gpuadmin.admin_base import ReadOnlyAdmin
from gpuadmin.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("sequence", "created_at", "action", "actor_name", "kill_request_id", "host_name")
    list_filter = ("action",)
    search_fields = ("host_name", "actor_name", "requester_name", "approver_name", "process_users")
    ordering = ("-sequence",)
    actions = None

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]
