"""A Django admin base that only shows.

Fleet rows are written by ingest, kill requests by the workflow services and
audit events by the hash-chained log; an edit made in the admin would bypass
all three, so their admins start from this base.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
