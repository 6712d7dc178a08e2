"""Admin: people, their unix / Slurm accounts and their choices are edited here; notifications only shown."""

from __future__ import annotations

from django.contrib import admin

from gpuadmin.admin_base import ReadOnlyAdmin
from gpuadmin.notify.models import Account, Notification, Person


class AccountInline(admin.TabularInline):
    model = Account
    extra = 1
    fields = ["kind", "name", "uid", "host"]


@admin.register(Person)
class PersonAdmin(admin.ModelAdmin):
    list_display = ["name", "email", "user", "notify_requests_to_approve", "notify_my_requests",
                    "notify_my_processes"]
    search_fields = ["name", "email", "accounts__name", "user__username"]
    autocomplete_fields = ["user"]
    inlines = [AccountInline]
    fieldsets = [
        (None, {"fields": ["name", "email", "user"]}),
        ("Notifications", {"fields": ["notification_urls", "notify_requests_to_approve", "notify_my_requests",
                                      "notify_my_processes"]}),
    ]


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ["__str__", "person", "kind", "name", "uid", "host"]
    list_filter = ["kind", "host"]
    search_fields = ["name", "person__name", "person__email"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = [
        "kill_request", "credential_change", "event", "recipient_name", "destination", "status", "attempts",
        "created_at",
    ]
    list_filter = ["status", "event", "role"]
    search_fields = ["recipient_name", "destination", "subject"]
    exclude = ["url"]  # may hold a token; ``destination`` is the masked form
