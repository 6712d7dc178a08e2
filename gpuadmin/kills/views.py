"""Kill request pages: the list (pending first, approve/reject inline with
htmx), one request's page with its live timeline, and the new-request form
with its preview.

The list's sections and the timeline are partial templates used by the full
pages and returned alone to htmx (their polls, and the list's inline
decisions), so a refresh renders exactly what the page did.
"""

from __future__ import annotations

import hashlib
from typing import Any, cast

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Case, IntegerField, Value, When
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpuadmin.accounts import sudo
from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role, has_role
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.htmx import HTMX_STOP_POLLING, HtmxHttpRequest, poll_seconds, vary_on_htmx, wants_fragment
from gpuadmin.kills import changes, plans, services
from gpuadmin.kills.forms import GpuResetRequestForm, KillRequestForm, parse_also
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.services import KillError, NotFound
from gpuadmin.kills.states import OPEN, RELEASING, Status

TIMELINE_POLL_SECONDS = 2
RECENT_FINAL_SHOWN = 50
# After a kill finished, the timeline keeps polling this long for the memory confirmation.
MEMORY_WAIT_SECONDS = 120

OPEN_ORDER = Case(
    When(status=Status.PENDING, then=Value(0)),
    When(status=Status.RUNNING, then=Value(1)),
    When(status=Status.APPROVED, then=Value(2)),
    default=Value(3),
    output_field=IntegerField(),
)


def _get_or_404(pk: int) -> KillRequest:
    try:
        return services.get_request(pk)
    except NotFound as error:
        raise Http404(error.message) from None


def _latest_documents(hosts: set[int]) -> dict[int, dict[str, Any]]:
    return LatestSnapshot.objects.documents_by_host_id(hosts)


def changes_fingerprint(compared: list[changes.TargetNow]) -> str:
    """What kind of change each target shows, as a short digest an Approve form carries.

    Amounts are left out (GPU memory moves a little between snapshots): the digest changes when a
    target has gone, would be refused, or changed state, owner, or whether its memory changed, so an
    approval is stopped only by news the approver has not seen.
    """
    kinds = sorted(
        (now.target.pid, now.gone, now.will_be_refused,
         now.row.state if now.row else "", (now.row.user or "") if now.row else "",
         now.row is not None and now.row.total_gpu_memory_bytes != now.target.total_gpu_memory_bytes)
        for now in compared if now.changes
    )
    return hashlib.sha256(repr(kinds).encode()).hexdigest()[:16] if kinds else ""


def _compared_now(kill_request: KillRequest, document: dict[str, Any] | None = None,
                  *, fetch: bool = True) -> list[changes.TargetNow]:
    if document is None and fetch:
        latest = LatestSnapshot.objects.for_host(kill_request.host)
        document = latest.document if latest else None
    return changes.compare(list(kill_request.targets.all()), document)


def _row_context(kill_request: KillRequest, user: Any, document: dict[str, Any] | None = None,
                 *, compare: bool = True, error: str = "", notice: str = "") -> dict[str, Any]:
    changed: list[str] = []
    fingerprint = ""
    if compare and kill_request.status == Status.PENDING:
        compared = _compared_now(kill_request, document)
        fingerprint = changes_fingerprint(compared)
        for now in compared:
            changed.extend(f"PID {now.target.pid}: {c}" for c in now.changes)
    return {
        "changes_seen": fingerprint,
        "kr": kill_request,
        "may_decide": services.may_decide(kill_request, user),
        "may_cancel": services.may_cancel(kill_request, user),
        "changed": changed,
        "row_error": error,
        "row_notice": notice,
    }


@require_GET
@role_required(Role.VIEWER)
@vary_on_htmx()
def kill_requests(request: HtmxHttpRequest) -> HttpResponse:
    context = _lists_context(request)
    if wants_fragment(request):  # the poll
        return render(request, "kills/_request_lists.html", context)
    return render(request, "kills/list.html", context)


def _lists_context(request: HttpRequest, *, decided: int | None = None, error: str = "",
                   notice: str = "") -> dict[str, Any]:
    """The list's three sections; ``decided``: the request an inline decision just acted on, whose
    row shows ``error`` (and the lists announce ``notice`` or ``error``)."""
    base = KillRequest.objects.shown()
    open_requests = list(
        base.filter(status__in=OPEN)
        .annotate(open_order=OPEN_ORDER)
        .order_by("open_order", "requested_at")
    )
    recent = list(base.exclude(status__in=OPEN)
                  .order_by("-requested_at")[:RECENT_FINAL_SHOWN])
    documents = _latest_documents({k.host_id for k in open_requests if k.status == Status.PENDING})

    def row_error(k: KillRequest) -> str:
        return error if k.pk == decided else ""

    rows = [_row_context(k, request.user, documents.get(k.host_id), error=row_error(k))
            for k in open_requests]
    return {
        "pending_rows": [r for r in rows if r["kr"].status == Status.PENDING],
        "active_rows": [r for r in rows if r["kr"].status != Status.PENDING],
        "recent_rows": [_row_context(k, request.user, compare=False, error=row_error(k)) for k in recent],
        "may_request": has_role(request.user, Role.REQUESTER),
        "poll_seconds": poll_seconds(),
        "decision_notice": notice,
        "decision_error": error,
        # Only a decision's answer announces: a poll must leave the last announcement in place.
        "announce": decided is not None,
    }


def _timeline_context(kill_request: KillRequest, user: Any) -> dict[str, Any]:
    still_live = not _timeline_settled(kill_request)
    return {
        # An approver sees a pending request's targets once, in "Before approving" with what changed.
        "targets_shown_for_approval": (
            kill_request.status == Status.PENDING and services.may_decide(kill_request, user)
        ),
        "kr": kill_request,
        "targets": list(kill_request.targets.all()),
        "steps": list(kill_request.steps.select_related("target").order_by("seq")),
        "poll_seconds": TIMELINE_POLL_SECONDS,
        "still_live": still_live,
        "awaiting_memory": (
            still_live and kill_request.is_final and kill_request.memory_expected_release_bytes > 0
        ),
    }


def _timeline_settled(kill_request: KillRequest) -> bool:
    """Final, and no memory confirmation worth waiting for."""
    from django.utils import timezone

    if not kill_request.is_final:
        return False
    if kill_request.memory_confirmed_at or kill_request.status not in RELEASING:
        return True
    finished = kill_request.finished_at
    return finished is None or (timezone.now() - finished).total_seconds() > MEMORY_WAIT_SECONDS


@require_GET
@role_required(Role.VIEWER)
def kill_request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    kill_request = _get_or_404(pk)
    context = _timeline_context(kill_request, request.user)
    context.update(_row_context(kill_request, request.user, compare=False))
    if kill_request.status == Status.PENDING:
        latest = LatestSnapshot.objects.for_host(kill_request.host)
        context["targets_now"] = changes.compare(context["targets"], latest.document if latest else None)
        context["changes_seen"] = changes_fingerprint(context["targets_now"])
        context["latest_taken_at"] = latest.taken_at if latest else None
    return render(request, "kills/detail.html", context)


@require_GET
@role_required(Role.VIEWER)
def kill_request_timeline(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        kill_request = _get_or_404(pk)
    except Http404:
        return HttpResponse("This kill request no longer exists.", status=HTMX_STOP_POLLING)
    context = _timeline_context(kill_request, request.user)
    # Once the request is final, the poll also takes down what the page said when it was loaded
    # ("Kill request #5 approved."): the outcome at the top replaces it.
    context["clear_messages"] = kill_request.is_final
    status = HTMX_STOP_POLLING if not context["still_live"] else 200
    return render(request, "kills/_timeline.html", context, status=status)


def _preview_context(request: HttpRequest, params: Any) -> dict[str, Any]:
    """The preview for ?host&pid&start (and include_descendants) or ?host&workload, or why there is none."""
    context: dict[str, Any] = {"preview": None, "preview_error": ""}
    host_name = params.get("host", "")
    workload = params.get("workload", "")
    pid = start = None
    if not workload:
        try:
            pid = int(params.get("pid", ""))
            start = int(params.get("start", ""))
        except ValueError:
            context["preview_error"] = (
                "Choose a process from a host page: this form needs host, pid and start."
            )
            return context
    host = Host.objects.filter(name=host_name).first()
    if host is None:
        context["preview_error"] = f"No host named {host_name!r}."
        return context
    include = not workload and params.get("include_descendants") in ("on", "true", "1")
    try:
        also = parse_also(params.get("also", ""))
    except ValueError as error:
        context["preview_error"] = f"Other targets: {error}."
        return context
    result = services.preview(host, pid, start, include_descendants=include, also=also, workload=workload)
    context.update(host=host, pid=pid, start=start, workload=workload, include_descendants=include, also=also,
                   preview=result)
    if result.ok:
        # Said before the form is filled: filing would be refused the same way.
        context["duplicate"] = services.open_request_target(host, result.targets, result.boot_id)
    return context


@require_http_methods(["GET", "POST"])
@role_required(Role.REQUESTER)
@vary_on_htmx()
def kill_request_new(request: HtmxHttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = KillRequestForm(request.POST)
        context = _preview_context(request, request.POST)
        if form.is_valid():
            try:
                kill_request = services.file_request(
                    request.user,
                    host=form.cleaned_data["host"],
                    pid=form.cleaned_data["pid"],
                    start_time_ticks=form.cleaned_data["start"],
                    workload=form.cleaned_data["workload"],
                    include_descendants=form.cleaned_data["include_descendants"],
                    also=form.cleaned_data["also"],
                    plan=form.cleaned_data["plan"],
                    reason=form.cleaned_data["reason"],
                )
            except KillError as error:
                form.add_error(None, error.message)
            else:
                messages.success(request, f"Kill request #{kill_request.pk} filed; it waits for an approver.")
                return redirect("kill_request_detail", pk=kill_request.pk)
        return render(request, "kills/new.html", {**context, "form": form, "plan_bounds": _plan_bounds()},
                      status=400)

    context = _preview_context(request, request.GET)
    if wants_fragment(request):
        return render(request, "kills/_preview.html", context)
    form = KillRequestForm(initial={
        "host": request.GET.get("host", ""), "pid": context.get("pid"), "start": context.get("start"),
        "workload": context.get("workload", ""),
        "include_descendants": context.get("include_descendants", False),
        "also": request.GET.get("also", ""),
    }, plan_preset=request.GET.get("plan"))
    return render(request, "kills/new.html", {**context, "form": form, "plan_bounds": _plan_bounds()})


def _reset_context(params: Any) -> dict[str, Any]:
    """The host and the GPU a reset request names (?host&gpu), as the newest snapshot shows it."""
    host = Host.objects.filter(name=params.get("host", "")).first()
    document = LatestSnapshot.objects.document_for(host) if host else None
    uuid = params.get("gpu", "")
    gpu = next((g for g in (document or {}).get("gpus", ()) if g.get("uuid") == uuid), None)
    return {"host": host, "gpu": gpu, "gpu_uuid": uuid}


@require_http_methods(["GET", "POST"])
@role_required(Role.REQUESTER)
def gpu_reset_request_new(request: HttpRequest) -> HttpResponse:
    """File a request to reset one GPU (the host page offers it where memory is driver-held)."""
    params = request.POST if request.method == "POST" else request.GET
    context = _reset_context(params)
    if request.method == "POST":
        form = GpuResetRequestForm(request.POST)
        if form.is_valid():
            try:
                kill_request = services.file_reset_request(
                    request.user, host=form.cleaned_data["host"], gpu_uuid=form.cleaned_data["gpu"],
                    reason=form.cleaned_data["reason"],
                )
            except KillError as error:
                form.add_error(None, error.message)
            else:
                messages.success(request,
                                 f"GPU reset request #{kill_request.pk} filed; it waits for an approver.")
                return redirect("kill_request_detail", pk=kill_request.pk)
        return render(request, "kills/reset_new.html", {**context, "form": form}, status=400)
    form = GpuResetRequestForm(initial={"host": params.get("host", ""), "gpu": params.get("gpu", "")})
    return render(request, "kills/reset_new.html", {**context, "form": form})


def _plan_bounds() -> dict[str, int]:
    return {"min": plans.MIN_GRACE_SECONDS, "max": plans.MAX_GRACE_SECONDS, "steps": plans.MAX_STEPS}


def _decided(request: HtmxHttpRequest, pk: int, action: str, do: Any, *, refused: str = "",
             already: bool = False) -> HttpResponse:
    """Run one decision; answer htmx (the list) with the list's sections as they are now, the
    request under its new status; a browser with a redirect. ``refused``: the decision was not
    made, for this reason; ``already``: it had been made by this user before."""
    error = notice = ""
    if refused:
        error = refused
    elif already:
        notice = f"Request #{pk} is {action} (it already was)."
    else:
        try:
            do()
            notice = f"Request #{pk} {action}."
        except KillError as exc:
            error = exc.message
    if wants_fragment(request):
        _get_or_404(pk)
        context = _lists_context(request, decided=pk, error=error, notice=notice)
        return render(request, "kills/_request_lists.html", context)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, notice)
    return redirect("kill_request_detail", pk=pk)


CHANGED_SINCE_SEEN = (
    "Something changed since this page was shown: read what changed for each target, then approve again."
)
APPROVE_INTENT = "kills.approve"


def _approve_summary(kill_request: KillRequest) -> str:
    """The words that name an approval on the re-authentication page: id, targets, host."""
    what = "GPU reset" if kill_request.is_reset else "kill"
    targets = ", ".join(f"PID {t.pid} {t.name}" for t in kill_request.targets.all()[:4])
    more = kill_request.targets.count() - 4
    if more > 0:
        targets += f" and {more} more"
    if kill_request.is_reset:
        targets = kill_request.gpu_label
    return f"Approve {what} request #{kill_request.pk} on {kill_request.host.name} ({targets})"


def _approve_checked(request: HtmxHttpRequest, pk: int, *, allow_sigkill_only: bool,
                     changes_seen: str) -> HttpResponse:
    """Approve if the targets show the same kinds of change the approver saw; else say so, approve nothing."""
    kill_request = _get_or_404(pk)
    pending = kill_request.status == Status.PENDING
    if pending and changes_fingerprint(_compared_now(kill_request)) != changes_seen:
        return _decided(request, pk, "approved", None, refused=CHANGED_SINCE_SEEN)
    if kill_request.status in (Status.APPROVED, Status.RUNNING, *RELEASING) and (
            kill_request.approved_by_id == request.user.pk):
        # A second submit of the same approval (a replay, a double click) is not an error.
        return _decided(request, pk, "approved", None, already=True)
    return _decided(request, pk, "approved",
                    lambda: services.approve(pk, request.user, allow_sigkill_only=allow_sigkill_only))


def finish_approval_intent(request: HttpRequest, data: dict[str, Any]) -> HttpResponse:
    """The approval a re-authentication interrupted, finished after the password (sudo's intent)."""
    if not has_role(request.user, Role.APPROVER):
        raise PermissionDenied("approving needs the approver role")
    return _approve_checked(cast(HtmxHttpRequest, request), int(data["pk"]),
                            allow_sigkill_only=bool(data.get("allow_sigkill_only")),
                            changes_seen=str(data.get("changes_seen", "")))


@require_POST
@role_required(Role.APPROVER)
def kill_request_approve(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    allow = request.POST.get("allow_sigkill_only") in ("on", "true", "1")
    seen = request.POST.get("changes_seen", "")
    if not sudo.recently_authenticated(request):
        # Password again (and a TOTP code when required); that POST then finishes this approval.
        kill_request = _get_or_404(pk)
        token = sudo.remember_intent(request, APPROVE_INTENT,
                                     {"pk": pk, "allow_sigkill_only": allow, "changes_seen": seen},
                                     summary=_approve_summary(kill_request))
        return sudo.reauth_response(request, reverse("kill_request_detail", args=[pk]), intent=token)
    return _approve_checked(request, pk, allow_sigkill_only=allow, changes_seen=seen)


@require_POST
@role_required(Role.APPROVER)
def kill_request_reject(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    return _decided(request, pk, "rejected",
                    lambda: services.reject(pk, request.user, request.POST.get("reason", "")))


@require_POST
@role_required(Role.VIEWER)  # the requester or any approver; the service decides
def kill_request_cancel(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    return _decided(request, pk, "cancelled",
                    lambda: services.cancel(pk, request.user, request.POST.get("reason", "")))
