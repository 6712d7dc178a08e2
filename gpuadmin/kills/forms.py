"""The new-request form: reason, descendants, and the plan editor (up to
MAX_STEPS rows of signal + grace; a row without a signal is dropped, whatever its grace)."""

from __future__ import annotations

from typing import Any

from django import forms

from gpuadmin.kills import plans

SIGNAL_CHOICES = [("", "—")] + [(s, s) for s in plans.SIGNALS]


class KillRequestForm(forms.Form):
    host = forms.CharField(max_length=253, widget=forms.HiddenInput)
    # One process (pid + start), or every process of a workload (a key such as "slurm_job:4242").
    pid = forms.IntegerField(min_value=1, required=False, widget=forms.HiddenInput)
    start = forms.IntegerField(min_value=0, required=False, widget=forms.HiddenInput)
    workload = forms.CharField(max_length=100, required=False, widget=forms.HiddenInput)
    # More targets beside (pid, start), as "pid:start,pid:start" (a finding's "kill all of them").
    also = forms.CharField(required=False, max_length=4000, widget=forms.HiddenInput)
    include_descendants = forms.BooleanField(required=False, label="Include every descendant as a target")
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70, "maxlength": 2000}),
        max_length=2000,
        label="Reason (required)",
        error_messages={"required": "A reason is required: say why this process must be stopped."},
    )

    def __init__(self, *args: Any, plan_preset: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        empty = {"signal": "", "grace_seconds": None}
        defaults = plans.preset(plan_preset) + [empty] * plans.MAX_STEPS
        grace_bounds = {"min": plans.MIN_GRACE_SECONDS, "max": plans.MAX_GRACE_SECONDS}
        for number in range(1, plans.MAX_STEPS + 1):
            initial = defaults[number - 1]
            self.fields[f"signal_{number}"] = forms.ChoiceField(
                choices=SIGNAL_CHOICES, required=False, initial=initial["signal"], label=f"Step {number}"
            )
            self.fields[f"grace_{number}"] = forms.IntegerField(
                required=False, initial=initial["grace_seconds"], label="grace (s)",
                widget=forms.NumberInput(attrs=grace_bounds),
            )

    def plan_rows(self) -> list[tuple[forms.BoundField, forms.BoundField]]:
        return [(self[f"signal_{n}"], self[f"grace_{n}"]) for n in range(1, plans.MAX_STEPS + 1)]

    def clean_also(self) -> list[tuple[int, int]]:
        try:
            return parse_also(self.cleaned_data.get("also") or "")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data  # what Form.clean returns; typed as possibly None
        if not cleaned.get("workload") and (cleaned.get("pid") is None or cleaned.get("start") is None):
            self.add_error(None, "Choose a process (or a job or container) from a host page.")
        raw: list[dict[str, Any]] = []
        for number in range(1, plans.MAX_STEPS + 1):
            signal = cleaned.get(f"signal_{number}")
            grace = cleaned.get(f"grace_{number}")
            if not signal:
                # "Leave a row empty to drop it": its signal set to "—" drops it, even with a grace
                # left in the number box (the presets fill every row's grace).
                continue
            if grace is None:
                self.add_error(f"grace_{number}", f"step {number} ({signal}) needs a grace period")
                continue
            raw.append({"signal": signal, "grace_seconds": grace})
        try:
            cleaned["plan"] = plans.validate_plan(raw)
        except plans.PlanError as exc:
            self.add_error(None, f"Plan: {exc}")
        return cleaned


def parse_also(text: str) -> list[tuple[int, int]]:
    """``"201:20100,202:20200"`` as [(201, 20100), (202, 20200)]; ValueError naming a bad item."""
    targets = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        pid, _, start = item.partition(":")
        if not (pid.isdigit() and start.isdigit()):
            raise ValueError(f"{item!r} is not pid:start")
        targets.append((int(pid), int(start)))
    return targets


class GpuResetRequestForm(forms.Form):
    host = forms.CharField(max_length=253, widget=forms.HiddenInput)
    gpu = forms.CharField(max_length=128, widget=forms.HiddenInput)
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70, "maxlength": 2000}),
        max_length=2000,
        label="Reason (required)",
        error_messages={"required": "A reason is required: say why this GPU must be reset."},
    )
