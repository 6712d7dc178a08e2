"""The audit filters, shared by the page, its CSV export and the API.

Query parameters: host, requester, approver, process_user, action,
kill_request, from, to (dates, YYYY-MM-DD, inclusive, in the panel's time zone).
Names match exactly; process_user matches one owner among an event's owners.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.utils import timezone

from gpuadmin.audit.models import Action, AuditEvent

FILTER_PARAMS = ("host", "requester", "approver", "process_user", "action", "kill_request", "from", "to")


class AuditFilterForm(forms.Form):
    host = forms.CharField(required=False, max_length=253, strip=True)
    requester = forms.CharField(required=False, max_length=150, strip=True)
    approver = forms.CharField(required=False, max_length=150, strip=True)
    process_user = forms.CharField(required=False, max_length=256, strip=True, label="Process owner")
    action = forms.ChoiceField(required=False, choices=[("", "any"), *Action.choices])
    kill_request = forms.IntegerField(required=False, min_value=1, label="Request #")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "from" is a keyword, so these two cannot be declared as attributes.
        date_input = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
        self.fields["from"] = forms.DateField(
            required=False, input_formats=["%Y-%m-%d"], widget=date_input, label="From"
        )
        self.fields["to"] = forms.DateField(
            required=False, input_formats=["%Y-%m-%d"], widget=date_input, label="To"
        )

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data  # what Form.clean returns; typed as possibly None
        start, end = cleaned.get("from"), cleaned.get("to")
        if start and end and start > end:
            self.add_error("to", "The end date is before the start date.")
        return cleaned


def _start_of(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def _owner_matches(name: str) -> Q:
    # process_users is "alice,bob"; match one whole name, not a substring of another.
    return (
        Q(process_users=name)
        | Q(process_users__startswith=f"{name},")
        | Q(process_users__endswith=f",{name}")
        | Q(process_users__contains=f",{name},")
    )


def apply_filters(events: QuerySet[AuditEvent], cleaned: dict[str, Any]) -> QuerySet[AuditEvent]:
    """Narrow ``events`` by the valid, non-empty values of a cleaned AuditFilterForm."""
    if cleaned.get("host"):
        events = events.filter(host_name=cleaned["host"])
    if cleaned.get("requester"):
        events = events.filter(requester_name=cleaned["requester"])
    if cleaned.get("approver"):
        events = events.filter(approver_name=cleaned["approver"])
    if cleaned.get("process_user"):
        events = events.filter(_owner_matches(cleaned["process_user"]))
    if cleaned.get("action"):
        events = events.filter(action=cleaned["action"])
    if cleaned.get("kill_request"):
        events = events.filter(kill_request_id=cleaned["kill_request"])
    if cleaned.get("from"):
        events = events.filter(created_at__gte=_start_of(cleaned["from"]))
    if cleaned.get("to"):
        events = events.filter(created_at__lt=_start_of(cleaned["to"] + timedelta(days=1)))
    return events


def filtered_events(params: Any) -> tuple[AuditFilterForm, QuerySet[AuditEvent]]:
    """The form bound to ``params`` and the events it selects, newest first.

    An invalid value is reported on the form and ignored in the query, so a
    bad date never hides the rest of the log.
    """
    form = AuditFilterForm({k: v for k, v in params.items() if k in FILTER_PARAMS})
    form.is_valid()
    cleaned = {k: v for k, v in getattr(form, "cleaned_data", {}).items() if k not in form.errors}
    return form, apply_filters(AuditEvent.objects.order_by("-sequence"), cleaned)
