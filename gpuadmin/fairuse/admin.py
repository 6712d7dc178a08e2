"""Admin: policies are edited here, every create, change and delete audited in its own transaction
(``policy_changed``); cases and notices are only shown (the services change them, audited)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.http import HttpRequest

from gpuadmin.admin_base import ReadOnlyAdmin
from gpuadmin.fairuse.models import Case, Notice, Policy
from gpuadmin.fairuse.services import audit_policy


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "condition", "mode", "scope", "minutes", "max_gpus"]
    list_filter = ["mode", "condition"]
    filter_horizontal = ["hosts", "people"]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # After the many-to-many fields are saved, so the event names the hosts and people it applies to.
        with transaction.atomic():
            super().save_related(request, form, formsets, change)
            audit_policy(form.instance, "changed" if change else "created", actor=request.user)

    def delete_model(self, request: HttpRequest, obj: Policy) -> None:
        with transaction.atomic():
            audit_policy(obj, "deleted", actor=request.user)
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic():
            for policy in queryset:
                audit_policy(policy, "deleted", actor=request.user)
            super().delete_queryset(request, queryset)


@admin.register(Case)
class CaseAdmin(ReadOnlyAdmin):
    list_display = ["policy", "summary", "status", "first_seen_at", "kill_request"]
    list_filter = ["status", "policy"]


@admin.register(Notice)
class NoticeAdmin(ReadOnlyAdmin):
    list_display = ["subject", "recipient_name", "status", "created_at"]
