"""The rows of the host page's process table (templates/web/_process_table.html), built in Python.

A page holds up to ``PROCESS_PAGE_ROWS`` rows of a dozen cells each, and the poll renders them again every
few seconds: as template markup (a node, a lookup and an escape per cell, a ``{% url %}`` per link) they
were two thirds of the page's CPU. Here each row is fixed markup filled by ``format_html``: every value
from the host goes through ``visible_controls`` (or is escaped as text inside an attribute), numbers are
shown as the template showed them (``localize``), and ``mark_safe`` is used only on fixed markup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from django import template
from django.urls import reverse
from django.utils.formats import localize
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import slugify

from gpuadmin.fleet.process_tree import Workload
from gpuadmin.text import human_bytes, human_duration, process_state
from gpuadmin.untrusted_text import visible_text
from gpuadmin.web.host_tables import ProcessTableRow
from gpuadmin.web.templatetags.gpuadmin_format import command_args, repeated_format, visible_controls

register = template.Library()

DEFAULT_ROW_IDS = "process"

_EMPTY = mark_safe("")
_ZOMBIE_BADGE = mark_safe(' <span class="badge badge-warning">zombie</span>')
_TRUNCATED = mark_safe(' <span class="truncated" title="the probe cut this command line; its SHA-256 covers '
                       'the full one">truncated</span>')
_NO_GPU_MEMORY = mark_safe("—")
_USERS_SEPARATOR = mark_safe(", ")

_ROW = (
    '<tr id="{ids}-{pid}-{start}" data-pid="{pid}">\n'
    '      <td data-label="PID" class="num"><a class="process-link" href="{url}">{pid}</a>{badges}</td>\n'
    '      <td data-label="User">{user}</td>\n'
    '      <td data-label="GPU memory" class="num gpu-memory">{gpu_memory}\n'
    "        {device_files}</td>\n"
    '      <td data-label="Host memory" class="num">{rss}</td>\n'
    '      <td data-label="State" class="mono{state_class}" title="{state_name}">{state}</td>\n'
    '      <td data-label="Age" class="num" title="{elapsed} s">{age}</td>\n'
    '      <td data-label="Parent" class="small">{parent}</td>\n'
    '      <td data-label="Command line">{command}{truncated}</td>\n'
    "      {actions}\n"
    "    </tr>\n"
)
_GROUP_ROW = (
    '<tr class="workload-group" id="{ids}-workload-{slug}" data-workload="{key}">\n'
    '      <td data-label="PID" class="num"><span title="PIDs {pids}">{count} processes</span></td>\n'
    '      <td data-label="User">{users}{person} '
    '<span class="small owner" title="{owner_details}">{label}</span></td>\n'
    '      <td data-label="GPU memory" class="num gpu-memory">{gpu_memory} '
    '<span class="muted">· total {total}</span></td>\n'
    '      <td data-label="Host memory" class="num">—</td>\n'
    '      <td data-label="State" class="mono" title="the members\' states">{states}</td>\n'
    '      <td data-label="Age" class="num" title="the oldest member">{age}</td>\n'
    '      <td data-label="Parent" class="small">'
    '<a href="?{expand_link}">show the {count} processes</a></td>\n'
    '      <td data-label="Command line">{command} <span class="muted small">(the biggest)</span></td>\n'
    "      {actions}\n"
    "    </tr>\n"
)
_OPEN_REQUEST_TITLE = "a kill request for this process is open"


def _or_unknown(value: Any) -> Any:
    """``|default_if_none:"?"``."""
    return "?" if value is None else value


# The process part of a process page's address as reversed for pid 1, start 2 (gpuadmin/web/urls.py).
_PROCESS_PLACEHOLDER = "1-2/"


class _Links:
    """The links of one table's rows. A process page's address is reversed once per table, then only its
    pid and start change from row to row: a ``reverse()`` per link was a third of the rows' time."""

    def __init__(self, host_name: str, kill_request_new_url: str | None) -> None:
        # What every row repeats, escaped once for the table.
        self.kill_request_new_url = escape(kill_request_new_url) if kill_request_new_url else None
        self.host_query = escape(quote(host_name, safe="/"))  # |urlencode
        # reverse() with the process's part as placeholders, so the address keeps whatever the URLconf
        # and the script prefix make of it; only the two numbers are filled in per row.
        url = reverse("process_detail", args=[host_name, 1, 2])
        self._process_head, found, self._process_tail = url.rpartition(_PROCESS_PLACEHOLDER)
        if not found:
            raise ValueError(f"process_detail's address {url!r} no longer ends in <pid>-<start>/")
        self._request_urls: dict[int, str] = {}

    def process(self, pid: int, start_time_ticks: int) -> str:
        return f"{self._process_head}{pid}-{start_time_ticks}/{self._process_tail}"

    def request(self, request_id: int) -> str:
        if request_id not in self._request_urls:
            self._request_urls[request_id] = reverse("kill_request_detail", args=[request_id])
        return self._request_urls[request_id]


def _gpu_memory(row: ProcessTableRow) -> SafeString:
    memory = row.gpu_memory
    if not memory:
        return _EMPTY
    values = [value for m in memory for value in (visible_controls(m.label), human_bytes(m.memory_bytes))]
    return format_html(repeated_format('<span class="per-gpu">{}: {}</span>', " · ", len(memory)), *values)


def _badges(row: ProcessTableRow, links: _Links) -> SafeString:
    p = row.process
    badges = _EMPTY
    if p.orphaned:
        badges += format_html(
            ' <span class="badge badge-warning" title="re-parented after its launcher went '
            '(group {}, session {})">orphan</span>', _or_unknown(p.pgid), _or_unknown(p.sid))
    if p.is_zombie:
        badges += _ZOMBIE_BADGE
    if row.zombie_children:
        badges += format_html(' <span class="badge badge-warning" title="defunct children only it can reap">'
                              "{} defunct</span>", row.zombie_children)
    if row.open_request_id and not links.kill_request_new_url:
        badges += format_html(' <a class="open-request small" href="{}" title="{}">#{}</a>',
                              links.request(row.open_request_id), _OPEN_REQUEST_TITLE, row.open_request_id)
    return badges


def _person(row: ProcessTableRow) -> SafeString:
    if not row.person:
        return _EMPTY
    return format_html(' <span class="small person">{}</span>', visible_controls(row.person))


def _user(row: ProcessTableRow) -> SafeString:
    p = row.process
    if p.user:
        user = visible_controls(p.user)
    else:
        user = format_html('<span class="muted">uid {}</span>', _or_unknown(p.uid))
    user += _person(row)
    if p.owner:
        user += format_html(' <span class="small muted owner" title="{}">{}</span>',
                            visible_text(p.owner_details), visible_controls(p.owner_label))
    elif p.container_id:
        user += format_html(' <span class="small muted mono" title="container id">ctr {}</span>',
                            visible_controls(p.container_id))
    return user


def _device_files(paths: tuple[str, ...]) -> SafeString:
    if not paths:
        return _EMPTY
    files = repeated_format('<div class="mono">{}</div>', "", len(paths))
    return format_html(
        f'<details class="device-files small"><summary>{{}} device file{{}}</summary>{files}</details>',
        len(paths), "" if len(paths) == 1 else "s", *[visible_controls(path) for path in paths],
    )


def _actions(row: ProcessTableRow, links: _Links) -> SafeString:
    """The row's last cell, for those who may ask for a kill: the open request, else the link to ask."""
    url = links.kill_request_new_url
    if not url:
        return _EMPTY
    p = row.process
    if row.open_request_id:
        action = format_html('<a class="open-request" href="{}" title="{}">#{} requested</a>',
                             links.request(row.open_request_id), _OPEN_REQUEST_TITLE, row.open_request_id)
    else:
        action = format_html(
            '<a class="request-kill" href="{}?host={}&amp;pid={}&amp;start={}">Request kill</a>',
            url, links.host_query, p.pid, p.start_time_ticks)
    workload = row.workload
    if workload:
        action += format_html(
            ' <a class="request-kill small" href="{}?host={}&amp;workload={}" title="every process of {} on '
            'this host">all of {}</a>', url, links.host_query, quote(workload.key, safe="/"),
            visible_text(workload.label), visible_controls(workload.label))
    return format_html('<td class="row-actions">{}</td>', action)


def _process_row(row: ProcessTableRow, ids: str, links: _Links) -> SafeString:
    p = row.process
    parent = row.parent
    if parent is not None:
        parent_cell = format_html('<a href="{}">{}</a> <span class="mono">{}</span>',
                                  links.process(parent.pid, parent.start_time_ticks), parent.pid,
                                  visible_controls(parent.name))
    else:
        parent_cell = format_html("{}", p.ppid)
    return format_html(
        _ROW, ids=ids, pid=p.pid, start=p.start_time_ticks, url=links.process(p.pid, p.start_time_ticks),
        badges=_badges(row, links), user=_user(row), gpu_memory=_gpu_memory(row) or _NO_GPU_MEMORY,
        device_files=_device_files(p.device_files), rss=human_bytes(p.rss_bytes),
        state_class=" state-uninterruptible" if p.state == "D" else "",
        state_name=process_state(str(p.state)), state=p.state,
        elapsed="?" if p.elapsed_seconds is None else localize(p.elapsed_seconds),
        age=human_duration(p.elapsed_seconds), parent=parent_cell, command=command_args(p),
        truncated=_TRUNCATED if p.cmdline_truncated else _EMPTY, actions=_actions(row, links),
    )


def _group_row(row: ProcessTableRow, workload: Workload, ids: str, links: _Links) -> SafeString:
    """A workload's processes in one row: its biggest member (``row.process``) speaks for the rest."""
    p = row.process
    users = format_html_join(_USERS_SEPARATOR, "{}", ((visible_controls(name),) for name in row.member_users))
    if not users:
        users = format_html('<span class="muted">uid {}</span>', _or_unknown(p.uid))
    url = links.kill_request_new_url
    actions = format_html(
        '<td class="row-actions"><a class="request-kill" href="{}?host={}&amp;workload={}">'
        "Request kill of all</a></td>", url, links.host_query, quote(workload.key, safe="/"),
    ) if url else _EMPTY
    return format_html(
        _GROUP_ROW, ids=ids, slug=slugify(workload.key), key=workload.key,
        pids=", ".join(str(pid) for pid in row.member_pids), count=len(row.members), users=users,
        person=_person(row), owner_details=visible_text(p.owner_details),
        label=visible_controls(workload.label),
        gpu_memory=_gpu_memory(row), total=human_bytes(row.total_gpu_memory_bytes), states=row.member_states,
        age=human_duration(p.elapsed_seconds), expand_link=row.expand_link, command=command_args(p),
        actions=actions,
    )


def _row(row: ProcessTableRow, ids: str, links: _Links) -> SafeString:
    workload = row.workload
    if row.is_group and workload is not None:  # members share a workload (host_tables.group_by_workload)
        return _group_row(row, workload, ids, links)
    return _process_row(row, ids, links)


@register.simple_tag
def process_table_rows(rows: Iterable[ProcessTableRow], host: Any, kill_request_new_url: str | None = None,
                       ids: str = "") -> SafeString:
    """Every row of the table, in order: a process's row, or a workload's collapsed one (``is_group``).
    ``ids``: the prefix of the rows' ids (``DEFAULT_ROW_IDS`` unless told); ``kill_request_new_url``: the
    form's address when the viewer may ask for a kill (the rows then carry the links to it)."""
    links = _Links(host.name, kill_request_new_url or None)
    ids = escape(ids or DEFAULT_ROW_IDS)
    return format_html_join("    ", "{}", ((_row(row, ids, links),) for row in rows))
