"""Pages: "My GPUs" (a person's processes across the fleet, stopping their own, their open cases),
one case (the "still needed" answer), one policy (its settings, its cases, and its dry run)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role
from gpuadmin.fairuse import dry_run, people, services
from gpuadmin.fairuse.models import Case, Nudge, Policy
from gpuadmin.fairuse.states import OPEN, NudgeState
from gpuadmin.kills import services as kills


@role_required(Role.VIEWER)
def my_gpus(request: HttpRequest) -> HttpResponse:
    person = people.person_of(request.user)
    now = timezone.now()
    held = people.processes_of(person, now) if person is not None else []
    others = people.processes_of(person, now, others=True) if person is not None else []
    nudges = (Nudge.objects.filter(recipient=person, status=NudgeState.OPEN).select_related("sender", "host")
              if person is not None else Nudge.objects.none())
    cases = (
        Case.objects.filter(person=person, status__in=OPEN).select_related("policy", "host")
        if person is not None
        else Case.objects.none()
    )
    return render(
        request,
        "fairuse/my_gpus.html",
        {
            "person": person,
            "held": held,
            "others": others,
            "nudges": nudges,
            "cases": cases,
            "self_service_refusal": kills.self_service_refusal(request.user),
        },
    )


@require_POST
@role_required(Role.VIEWER)
def stop_mine(request: HttpRequest) -> HttpResponse:
    person = people.person_of(request.user)
    try:
        pid, start = int(request.POST.get("pid", "")), int(request.POST.get("start_time_ticks", ""))
    except ValueError:
        messages.error(request, "pid and start_time_ticks must be numbers")
        return redirect("my_gpus")
    try:
        host = kills.get_host(request.POST.get("host", ""))
        if person is None:
            raise kills.NotAllowed("your panel account is not linked to a person: ask an admin to link it")
        kill_request = kills.stop_own_processes(
            request.user,
            host=host,
            own_uids=people.own_uids(person, host),
            person_name=person.name,
            pid=pid,
            start_time_ticks=start,
        )
    except kills.KillError as error:
        messages.error(request, error.message)
        return redirect("my_gpus")
    messages.success(
        request, f"Stopping PID {pid} on {host.name} (request #{kill_request.pk}, self-service)."
    )
    return redirect("kill_request_detail", kill_request.pk)


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def case_detail(request: HttpRequest, case_id: int) -> HttpResponse:
    case = get_object_or_404(
        Case.objects.select_related("policy", "host", "person", "kill_request"), pk=case_id
    )
    if request.method == "POST":
        try:
            services.snooze(case.pk, request.user, request.POST.get("reason", ""))
        except services.NotAllowed as refusal:
            messages.error(request, str(refusal))
        else:
            messages.success(request, "Snoozed: noted as still needed.")
        return redirect("fair_use_case", case.pk)
    mine = people.person_of(request.user)
    return render(
        request,
        "fairuse/case.html",
        {
            "case": case,
            "may_snooze": mine is not None and case.person_id == mine.pk,
        },
    )


@role_required(Role.VIEWER)
def policy_detail(request: HttpRequest, policy_id: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=policy_id)
    return render(
        request,
        "fairuse/policy.html",
        {
            "policy": policy,
            "would_have": dry_run.would_have(policy, timezone.now()),
            "dry_run_resolution": dry_run.resolution(),
            "cases": policy.cases.select_related("host", "person", "kill_request")[:100],
        },
    )


@require_POST
@role_required(Role.VIEWER)
def nudge(request: HttpRequest) -> HttpResponse:
    try:
        pid, start = int(request.POST.get("pid", "")), int(request.POST.get("start_time_ticks", ""))
        sent = services.nudge(request.user, host=request.POST.get("host", ""), pid=pid,
                              start_time_ticks=start, message=request.POST.get("message", ""))
    except ValueError:
        messages.error(request, "pid and start_time_ticks must be numbers")
    except services.NotAllowed as refusal:
        messages.error(request, str(refusal))
    else:
        messages.success(request, f"Asked {sent.recipient.name} to release it.")
    return redirect("my_gpus")
