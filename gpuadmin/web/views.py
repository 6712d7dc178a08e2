"""Pages: the fleet overview and one page per host.

Each table region is one partial template, included by the full page and
returned alone when htmx polls it (``gpuadmin.htmx``), so the refresh can
never drift from the first render.
"""

from __future__ import annotations

import logging

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gpuadmin.accounts import sudo
from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role, has_role
from gpuadmin.fleet.history import series
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.models import Finding, Gpu, Host, LatestSnapshot, ProcessLife
from gpuadmin.fleet.probes import ProbeTooSoon, probe_now
from gpuadmin.htmx import (
    HTMX_STOP_POLLING,
    HTTP_NO_CONTENT,
    HtmxHttpRequest,
    fragment_target,
    poll_seconds,
    vary_on_htmx,
    wants_fragment,
)
from gpuadmin.kills.plans import REAP_PLAN_NAME
from gpuadmin.kills.services import open_requests_by_process
from gpuadmin.notify.directory import Directory
from gpuadmin.text import human_age
from gpuadmin.web import attention
from gpuadmin.web.finding_actions import finding_view, kill_request_url
from gpuadmin.web.fleet_page import SORTS, STATUSES, FleetPage, FleetQuery, changes
from gpuadmin.web.host_tables import (
    SHOW_CHOICES,
    SORT_DESCENDING_BY_DEFAULT,
    ProcessQuery,
    exited_launchers,
    host_tables,
)
from gpuadmin.web.process_page import process_page

logger = logging.getLogger(__name__)

# The regions of the host page an htmx request may ask for, by the id of the element it targets.
HOST_PROCESSES_TARGET = "host-processes"
HOST_HISTORY_TARGET = "host-history"
# The host page's charts start at the last hour: a fresh install has minutes of history, not a day.
HOST_PAGE_RANGE = "1h"


def _host_gone(request: HttpRequest, name: str) -> HttpResponse:
    """A polled host that no longer exists: tell the page and stop the polling."""
    return render(request, "web/_host_gone.html", {"name": name}, status=HTMX_STOP_POLLING)


@require_GET
@role_required(Role.VIEWER)
@vary_on_htmx()
def fleet(request: HtmxHttpRequest) -> HttpResponse:
    """The page, or (htmx's poll, which says what it shows in ``seen``) only what changed since:
    204 for nothing, else the changed rows and summary out of band (``gpuadmin.web.fleet_page``)."""
    whole_page = not wants_fragment(request)
    page = FleetPage.load(FleetQuery.from_params(request.GET), timezone.now(), gpu_models=whole_page)
    # The nav's count from the summary's figures: the context processor's queries are not run.
    nav_attention = attention.keep(page.summary.attention_count)
    context = {"fleet": page, "poll_seconds": poll_seconds(), "statuses": STATUSES,
               "finding_kinds": Finding.Kind.choices, "nav_attention": nav_attention}
    if whole_page:
        # The summary counted the hosts awaiting acceptance: none, no query for them.
        awaiting = _awaiting_for(request) if page.summary.hosts_awaiting else []
        return render(request, "web/fleet.html", {**context, "awaiting_hosts": awaiting, "sorts": SORTS})
    changed = changes(page, request.GET.get("seen", ""))
    if changed.nothing:
        return HttpResponse(status=HTTP_NO_CONTENT)
    return render(request, "web/_fleet_changes.html", {**context, "changes": changed})


@require_GET
@role_required(Role.VIEWER)
@vary_on_htmx("HX-Target")
def host_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    host = Host.objects.for_listing().named(name)
    if host is None:
        if wants_fragment(request):
            return _host_gone(request, name)
        awaiting = next((h for h in _awaiting_for(request) if h.name == name), None)
        if awaiting is not None:
            return render(request, "web/host_awaiting.html", {"host": awaiting})
        raise Http404(f"No host named {name!r} has sent a snapshot.")
    gpus = list(host.present_gpus)
    query = ProcessQuery.from_params(request.GET)
    try:
        history_range = series.parse_range(request.GET.get("range") or HOST_PAGE_RANGE).name
    except series.UnknownRange:
        history_range = HOST_PAGE_RANGE
    document = LatestSnapshot.objects.document_for(host)
    boot_id = (document or {}).get("host", {}).get("boot_id", "")
    may_request = has_role(request.user, Role.REQUESTER)
    kill_request_new_url = reverse("kill_request_new") if may_request else None
    context = {
        "host": host,
        "gpus": gpus,
        "query": query,
        "tables": host_tables(
            document, gpus, query, Directory.for_host(host).name_of_row,
            open_requests=open_requests_by_process(host, boot_id),
        ),
        "exited_launchers": exited_launchers(ProcessLife.objects.left_by_launcher(host)),
        "findings": [
            finding_view(f, host, may_request=may_request) for f in host.findings.open().most_severe_first()
        ],
        "poll_seconds": poll_seconds(),
        "kill_request_new_url": kill_request_new_url,
        "sort_keys": list(SORT_DESCENDING_BY_DEFAULT),
        "show_choices": SHOW_CHOICES,
        "sort_links": {key: query.sorted_by(key) for key in SORT_DESCENDING_BY_DEFAULT},
        "history_range": history_range,
        "history_ranges": list(series.RANGES),
        "history_charts": history_charts(host, gpus, history_range),
    }
    if not wants_fragment(request):
        return render(request, "web/host_detail.html", context)
    if fragment_target(request) == HOST_PROCESSES_TARGET:
        return render(request, "web/_host_processes.html", context)
    if fragment_target(request) == HOST_HISTORY_TARGET:
        return render(request, "web/_host_history.html", context)
    # The poll: the tables, plus the summary (status, findings, GPU cards) out of band.
    return render(request, "web/_host_refresh.html", context)


def _awaiting_for(request: HttpRequest) -> list[Host]:
    """Hosts awaiting acceptance, for approvers only: they decide, and the names are not fleet data."""
    if not has_role(request.user, Role.APPROVER):
        return []
    return list(Host.objects.awaiting_acceptance())


@require_POST
@role_required(Role.APPROVER)
def host_accept(request: HttpRequest, name: str) -> HttpResponse:
    """Accept the key whose fingerprint the approver saw (sent back with the form), and no other."""
    if not sudo.recently_authenticated(request):
        # Trusting a host's key lets it speak for that host: password again, as for approving a kill.
        return sudo.reauth_response(request, reverse("host_detail", args=[name]))
    try:
        host = trust.accept_host(name, actor=request.user,
                                 expected_fingerprint=request.POST.get("fingerprint", "") or "-")
    except Host.DoesNotExist:
        raise Http404(f"No host named {name!r}.") from None
    except trust.KeyMismatch as error:
        messages.error(request, f"Not accepted: {error}")
        return redirect("host_detail", name=name)
    messages.success(request, f"Accepted {host.name} ({host.key_fingerprint}); its snapshots count now.")
    return redirect("host_detail", name=host.name)


@require_POST
@role_required(Role.APPROVER)
def awaiting_hosts_clear(request: HttpRequest) -> HttpResponse:
    """Withdraw offered keys nobody accepted: the one named (``name``), or every one. Made-up names can
    fill the slots awaiting acceptance; each withdrawal is an audit event, and a real host offers again
    when its agent next sends a snapshot."""
    name = request.POST.get("name", "")
    offers = Host.objects.awaiting_acceptance()
    withdrawn = trust.withdraw_offers(offers.filter(name=name) if name else offers, actor=request.user)
    plural = "s" if withdrawn != 1 else ""
    messages.success(request, f"Cleared {withdrawn} offer{plural} awaiting acceptance (audited).")
    return redirect("fleet")


@require_GET
@role_required(Role.VIEWER)
def process_detail(request: HttpRequest, name: str, pid: int, start_time_ticks: int) -> HttpResponse:
    host = get_object_or_404(Host, name=name)
    page = process_page(host, pid, start_time_ticks)
    if page is None:
        raise Http404(f"{name} has no recorded process {pid} started at tick {start_time_ticks}.")
    may_request = page.alive and has_role(request.user, Role.REQUESTER)
    parent = page.parents[0] if page.parents else None
    context = {
        "host": host,
        "page": page,
        "kill_request_new_url": reverse("kill_request_new") if may_request else None,
        # The one action for zombies: their parent asked to reap them (the zombies finding's action).
        "reap_url": (kill_request_url(host, [(page.pid, page.start_time_ticks)], plan=REAP_PLAN_NAME)
                     if may_request and page.may_be_asked_to_reap else None),
        "parent_reap_url": (
            kill_request_url(host, [(parent.pid, parent.start_time_ticks)], plan=REAP_PLAN_NAME)
            if may_request and page.zombie and parent and parent.start_time_ticks is not None
            and parent.pid != 1 else None
        ),
    }
    return render(request, "web/process_detail.html", context)


def history_charts(host: Host, gpus: list[Gpu], range_name: str) -> list[dict[str, str | None]]:
    """The host page's charts: two per GPU (its memory and utilization, its temperature and power),
    then the host's process counts (drawn by static/js/charts.js)."""
    charts: list[dict[str, str | None]] = []
    for gpu in gpus:
        charts.append({
            "kind": "gpu",
            "gpu_uuid": gpu.uuid,
            "title": f"GPU {gpu.index}: memory (attributed, unattributed) and utilization",
            "csv_name": f"{host.name}-gpu{gpu.index}-{range_name}.csv",
        })
        charts.append({
            "kind": "gpu-health",
            "gpu_uuid": gpu.uuid,
            "title": f"GPU {gpu.index}: temperature and power (draw, limit)",
            "csv_name": f"{host.name}-gpu{gpu.index}-health-{range_name}.csv",
        })
    charts.append(
        {
            "kind": "host",
            "gpu_uuid": None,
            "title": "Zombies, processes in D state, PIDs in use against pid_max",
            "csv_name": f"{host.name}-processes-{range_name}.csv",
        }
    )
    return charts


@require_POST
@role_required(Role.VIEWER)
def host_probe(request: HttpRequest, name: str) -> HttpResponse:
    host = get_object_or_404(Host, name=name)
    if not host.is_online:
        # Its agent has not answered for a while: a probe goes out, but nothing says it will be answered,
        # and a green "asked" would read as "it is fine".
        seen = (f"last seen {human_age((timezone.now() - host.last_seen_at).total_seconds())}"
                if host.last_seen_at else "never seen")
        try:
            probe_now(host.name)
        except ProbeTooSoon:
            pass
        except Exception:
            logger.exception("could not send an on-demand probe to %s", host.name)
        messages.warning(
            request, f"{host.name} is offline ({seen}): its data below is old. A probe was sent; "
            "the page changes only if its agent answers (check that the agent runs on it)."
        )
        return redirect("host_detail", name=host.name)
    try:
        probe_now(host.name)
    except ProbeTooSoon as exc:
        messages.info(request, str(exc))
    except Exception as exc:
        # The broker may be down; say so instead of a 500, and keep the page usable.
        logger.exception("could not send an on-demand probe to %s", host.name)
        messages.error(request, f"Could not ask {host.name} for a probe: {exc}")
    else:
        messages.success(
            request, f"Asked {host.name} for a new snapshot; the tables refresh when it arrives."
        )
    return redirect("host_detail", name=host.name)


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico for whatever asks without reading the page's <link rel=icon>: the same icon."""
    return redirect(static("favicon.svg"), permanent=True)
