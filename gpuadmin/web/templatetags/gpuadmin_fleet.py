"""The fleet page's own compact form: one small cell per GPU ("14/80 82%": GiB used of total, busy).

Built with format_html, not included templates: the table draws up to 400 GPU cells a page.
"""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

# One GPU in a fleet row: "30/80 97%" over a thin memory bar (attributed, then unattributed). SVG
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


# human_bytes' units in GiB: the cell says whole GiB ("14/80"), the title the exact figures.
_IN_GIB = {"TiB": 1024.0, "GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2, "bytes": 1 / 1024**3, "byte": 0.0}


def _gib(size: str) -> str:
    """``human_bytes``' "14.4 GiB" as whole GiB, "14"; under half a GiB, "0"; unknown ("—") as it is."""
    figure, _, unit = size.partition(" ")
    try:
        return str(round(float(figure) * _IN_GIB[unit]))
    except (KeyError, ValueError):
        return size


def _used_of_total(used: str, total: str) -> str:
    """"14/80": used and total memory in whole GiB (the column's header says the unit)."""
    return f"{_gib(used)}/{_gib(total)}"


@register.filter
def gpu_cell(cell: tuple[dict[str, str], int | None]) -> SafeString:
    """One GPU's cell from ``FleetRow.gpu_cells``: its ``memory_bar`` figures and its utilisation."""
    bar, utilization = cell
    return format_html(
        _GPU_CELL, title=bar["title"], index=bar["index"], memory=_used_of_total(bar["used"], bar["total"]),
        utilization="" if utilization is None else f"{utilization}%",
        attributed_percent=bar["attributed_percent"], unattributed_percent=bar["unattributed_percent"],
    )
