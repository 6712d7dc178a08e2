"""Pages: the fleet overview and one page per host.

Each table region is one partial template, included by the full page and
returned alone when htmx polls it (``gpuadmin.web.htmx``), so the refresh can
never drift from the first render.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role, has_role
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.fleet.probes import probe_now
from gpuadmin.notify.directory import Directory
from gpuadmin.web.host_tables import SORT_DESCENDING_BY_DEFAULT, ProcessQuery, host_tables
from gpuadmin.web.htmx import HTMX_STOP_POLLING, fragment_target, vary_on_htmx, wants_fragment

logger = logging.getLogger(__name__)

# The regions of the host page an htmx request may ask for, by the id of the element it targets.
HOST_PROCESSES_TARGET = "host-processes"


def _poll_seconds() -> int:
    return max(1, int(settings.GPUADMIN_PROBE_INTERVAL_SECONDS))


def _host_gone(request: HttpRequest, name: str) -> HttpResponse:
    """A polled host that no longer exists: tell the page and stop the polling."""
    return render(request, "web/_host_gone.html", {"name": name}, status=HTMX_STOP_POLLING)


@require_GET
@role_required(Role.VIEWER)
@vary_on_htmx()
def fleet(request: HttpRequest) -> HttpResponse:
    context = {"hosts": list(Host.objects.for_listing()), "poll_seconds": _poll_seconds()}
    if wants_fragment(request):
        return render(request, "web/_fleet_hosts.html", context)
    return render(request, "web/fleet.html", context)


@require_GET
@role_required(Role.VIEWER)
@vary_on_htmx("HX-Target")
def host_detail(request: HttpRequest, name: str) -> HttpResponse:
    host = Host.objects.for_listing().named(name)
    if host is None:
        if wants_fragment(request):
            return _host_gone(request, name)
        raise Http404(f"No host named {name!r} has sent a snapshot.")
    gpus = list(host.present_gpus)
    query = ProcessQuery.from_params(request.GET)
    kill_request_new_url = reverse("kill_request_new") if has_role(request.user, Role.REQUESTER) else None
    context = {
        "host": host,
        "gpus": gpus,
        "query": query,
        "tables": host_tables(
            LatestSnapshot.objects.document_for(host), gpus, query, Directory.for_host(host).name_of_row
        ),
        "findings": host.findings.open().most_severe_first(),
        "poll_seconds": _poll_seconds(),
        "kill_request_new_url": kill_request_new_url,
        "sort_keys": list(SORT_DESCENDING_BY_DEFAULT),
        "sort_links": {key: query.sorted_by(key) for key in SORT_DESCENDING_BY_DEFAULT},
    }
    if not wants_fragment(request):
        return render(request, "web/host_detail.html", context)
    if fragment_target(request) == HOST_PROCESSES_TARGET:
        return render(request, "web/_host_processes.html", context)
    # The poll: the tables, plus the summary (status, findings, GPU cards) out of band.
    return render(request, "web/_host_refresh.html", context)


@require_POST
@role_required(Role.VIEWER)
def host_probe(request: HttpRequest, name: str) -> HttpResponse:
    host = get_object_or_404(Host, name=name)
    try:
        probe_now(host.name)
    except Exception as exc:
        # The broker may be down; say so instead of a 500, and keep the page usable.
        logger.exception("could not send an on-demand probe to %s", host.name)
        messages.error(request, f"Could not ask {host.name} for a probe: {exc}")
    else:
        messages.success(
            request, f"Asked {host.name} for a new snapshot; the tables refresh when it arrives."
        )
    return redirect("host_detail", name=host.name)
