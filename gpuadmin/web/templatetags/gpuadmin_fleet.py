"""The fleet page's own compact forms: one small cell per GPU, and "as of 02:13, 4 min ago" for old data.

Built with format_html, not included templates: the table draws up to 400 GPU cells a page.
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from gpuadmin.text import human_duration

register = template.Library()

# One GPU in a fleet row: "30/80 GiB 97%" over a thin memory bar (attributed, then unattributed). SVG
# lengths, not style attributes (the Content-Security-Policy allows none). The figures in full are in
# the title; the bar repeats the text, so it is hidden from screen readers.
_GPU_CELL = (
    '<span class="gpu-cell" title="{title}">'
    '<span class="gpu-cell-text"><span class="visually-hidden">GPU {index}: </span>'
    "{memory} {utilization}</span>"
    '<svg class="mini-bar" aria-hidden="true" focusable="false">'
    '<rect class="bar-attributed" width="{attributed_percent}%" height="100%"/>'
    '<rect class="bar-unattributed" x="{attributed_percent}%" width="{unattributed_percent}%" height="100%"/>'
    "</svg></span>"
)


def _used_of_total(used: str, total: str) -> str:
    """"30/80 GiB" when both are in one unit, else "512 MiB/80 GiB"."""
    used_figure, _, used_unit = used.partition(" ")
    total_figure, _, total_unit = total.partition(" ")
    if used_unit and used_unit == total_unit:
        return f"{used_figure}/{total_figure} {total_unit}"
    return f"{used}/{total}"


@register.filter
def gpu_cell(cell: tuple[dict[str, str], int | None]) -> SafeString:
    """One GPU's cell from ``FleetRow.gpu_cells``: its ``memory_bar`` figures and its utilisation."""
    bar, utilization = cell
    return format_html(
        _GPU_CELL, title=bar["title"], index=bar["index"], memory=_used_of_total(bar["used"], bar["total"]),
        utilization="" if utilization is None else f"{utilization}%",
        attributed_percent=bar["attributed_percent"], unattributed_percent=bar["unattributed_percent"],
    )


def age_text(seconds: float) -> str:
    """How long ago, in its largest unit only ("4 min ago", "2 h ago"): short enough for a table row."""
    if seconds < 5:
        return "just now"
    return " ".join(human_duration(seconds).split(" ")[:2]) + " ago"


@register.filter
def as_of(moment: datetime | None, now: datetime | None = None) -> SafeString:
    """"as of 02:13, 4 min ago": when data that is no longer current was taken, in the lab's time zone
    (TIME_ZONE), the date too when it was not today; the full time on hover."""
    if not isinstance(moment, datetime):
        return mark_safe('<span class="stale-as-of">never seen</span>')
    now = now or timezone.now()
    local, local_now = timezone.localtime(moment), timezone.localtime(now)
    shown = f"{local:%H:%M}" if local.date() == local_now.date() else f"{local:%Y-%m-%d %H:%M}"
    return format_html(
        '<time class="stale-as-of" datetime="{}" title="{}">as of {}, {}</time>',
        moment.isoformat(), f"{local:%Y-%m-%d %H:%M:%S %Z}", shown, age_text((now - moment).total_seconds()),
    )
