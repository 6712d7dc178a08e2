"""The usage page (``/usage/``), its CSV and the processes behind one of its rows.

The page and the CSV read the one ``queries.usage_table`` and write each row's ``cells()``: the CSV
is exactly the table.
"""

from __future__ import annotations

import csv
import io
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.http import require_GET

from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role
from gpuadmin.usage.queries import (
    PRESET_DAYS,
    BadQuery,
    Grouping,
    Sort,
    UsageTable,
    last_days,
    parse_choice,
    parse_period,
    processes_behind,
    usage_table,
)


def _table(request: HttpRequest) -> UsageTable:
    """The table the request's from, to, by and sort ask for; raises ``BadQuery``."""
    params = request.GET
    period = parse_period(params.get("from"), params.get("to"))
    return usage_table(period, parse_choice(Grouping, params.get("by"), Grouping.USER, "by"),
                       parse_choice(Sort, params.get("sort"), Sort.HELD, "sort"))


def _query(table: UsageTable, **changes: str) -> str:
    values = {"from": table.period.start.isoformat(), "to": table.period.end.isoformat(), "by": table.by,
              "sort": table.sort, **changes}
    return urlencode(values)


@require_GET
@role_required(Role.VIEWER)
def usage_page(request: HttpRequest) -> HttpResponse:
    try:
        table = _table(request)
    except BadQuery as error:
        return HttpResponseBadRequest(str(error))
    presets = [(days, last_days(days)) for days in PRESET_DAYS]
    return render(request, "usage/usage.html", {
        "table": table, "header": table.header,
        "rows": [(row, row.cells(), _query(table, key=row.key)) for row in table.rows],
        "groupings": Grouping.choices, "sorts": Sort.choices,
        "presets": [(days, p.start.isoformat(), p.end.isoformat()) for days, p in presets],
        "csv_query": _query(table),
    })


# A cell a spreadsheet would read as a formula (a user or container name is whatever a host says).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(cell: str) -> str:
    """``cell``, with a leading apostrophe when it would start a formula: shown as text, never run."""
    return "'" + cell if cell.startswith(_FORMULA_STARTS) else cell


def write_csv(table: UsageTable) -> str:
    """The table as CSV: its header and each row's cells, as the page shows them (``spreadsheet_safe``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(table.header)
    for row in table.rows:
        writer.writerow([spreadsheet_safe(cell) for cell in row.cells()])
    return out.getvalue()


@require_GET
@role_required(Role.VIEWER)
def usage_csv(request: HttpRequest) -> HttpResponse:
    try:
        table = _table(request)
    except BadQuery as error:
        return HttpResponseBadRequest(str(error))
    response = HttpResponse(write_csv(table), content_type="text/csv; charset=utf-8")
    name = f"gpu-usage-{table.by}-{table.period.start}-{table.period.end}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@require_GET
@role_required(Role.VIEWER)
def usage_processes(request: HttpRequest) -> HttpResponse:
    try:
        table = _table(request)
    except BadQuery as error:
        return HttpResponseBadRequest(str(error))
    key = request.GET.get("key", "")
    lives = processes_behind(table.period, table.by, key)
    label = next((row.label for row in table.rows if row.key == key), key)
    return render(request, "usage/processes.html", {"table": table, "label": label, "lives": lives,
                                                    "back": _query(table)})
