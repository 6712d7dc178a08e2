"""JSON API for kill requests: /api/v1/kill-requests/...

Same rules as the pages, because both call the same services: a requester
files, a different approver approves or rejects (self-approval answers 403
unless GPUADMIN_ALLOW_SELF_APPROVAL), the requester or an approver cancels.
A refused or invalid request answers 4xx with ``{"error": "...", "detail":
"..."}`` (the same text; ``detail`` is what every other endpoint uses) and,
for a zombie, ``parent_offer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from knox.models import get_token_model
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin.accounts import sudo
from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.api_schema import (
    BAD_INPUT,
    BOOLEAN,
    COMMON_ERRORS,
    INTEGER,
    NOT_FOUND,
    STRING,
    body,
    error,
    query,
)
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.kills import changes, services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.serializers import (
    KillPreviewSerializer,
    KillRequestDetailSerializer,
    KillRequestSerializer,
    preview_data,
)
from gpuadmin.kills.services import BadInput, KillError
from gpuadmin.kills.states import Status

LIST_LIMIT = 200
DECISION_RESPONSES = {200: KillRequestDetailSerializer, **BAD_INPUT, **COMMON_ERRORS, **NOT_FOUND,
                      409: error("the request's status does not allow this now")}


def _error(error: KillError) -> Response:
    return Response({**error.as_dict(), "detail": error.message}, status=error.status_code)


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise BadInput("the body must be a JSON object")
    return request.data


def _int(value: Any, name: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} must be a non-negative integer; got {value!r}", field=name)
    return value


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "1"):
        return True
    if value in (None, "", "false", "0"):
        return False
    raise BadInput(f"{name} must be true or false; got {value!r}", field=name)


def detail_data(kill_request: KillRequest) -> Any:
    targets_now = None
    if kill_request.status == Status.PENDING:
        # What an approver would see now: each target against the newest snapshot.
        latest = LatestSnapshot.objects.for_host(kill_request.host)
        targets_now = changes.compare(list(kill_request.targets.all()), latest.document if latest else None)
    return KillRequestDetailSerializer(kill_request, context={"targets_now": targets_now}).data


@extend_schema(methods=["GET"], summary="Kill requests, newest first (at most 200)", tags=["kills"],
               operation_id="kill_requests_list",
               parameters=[query("status", "only this status", enum=list(Status.values)),
                           query("host", "only this host")],
               responses={200: KillRequestSerializer(many=True), **BAD_INPUT, **COMMON_ERRORS})
@extend_schema(methods=["POST"], summary="File a kill request (role requester)", tags=["kills"],
               request=body({
                   "host": STRING, "pid": INTEGER, "start_time_ticks": INTEGER,
                   "include_descendants": BOOLEAN, "workload": STRING, "plan": {"type": "array"},
                   "reason": STRING,
               }, required=("host", "reason")),
               responses={201: KillRequestDetailSerializer, **BAD_INPUT, **COMMON_ERRORS, **NOT_FOUND,
                          409: error("the process is already the target of an open request"),
                          422: error("the rules refuse the target (PID 1, a zombie, protected...)")})
@api_view(["GET", "POST"])
@renderer_classes([AsciiJSONRenderer])
def kill_requests(request: Request) -> Response:
    if request.method == "POST":
        try:
            body = _body(request)
            host = body.get("host")
            if not isinstance(host, str) or not host:
                raise BadInput("host must be a host name", field="host")
            kill_request = services.file_request(
                request.user,
                host=host,
                pid=body.get("pid"),
                start_time_ticks=body.get("start_time_ticks"),
                include_descendants=_bool(body.get("include_descendants", False), "include_descendants"),
                workload=body.get("workload") or "",
                plan=body.get("plan"),
                reason=reason if isinstance(reason := body.get("reason"), str) else "",
            )
        except KillError as error:
            return _error(error)
        return Response(KillRequestDetailSerializer(kill_request).data, status=201)

    found = KillRequest.objects.shown()
    status = request.query_params.get("status")
    if status:
        if status not in Status.values:
            return _error(BadInput(f"status must be one of {', '.join(Status.values)}", field="status"))
        found = found.filter(status=status)
    if host := request.query_params.get("host"):
        found = found.filter(host__name=host)
    return Response(KillRequestSerializer(found.order_by("-requested_at")[:LIST_LIMIT], many=True).data)


@extend_schema(summary="What a request would target, without filing it", tags=["kills"], parameters=[
    query("host", "host name"), query("pid", "process id", kind=int),
    query("start_time_ticks", "the process's start time in clock ticks", kind=int),
    query("include_descendants", "true to list every descendant too"),
    query("workload", "a workload key instead of a process (slurm_job:4242)"),
], responses={200: KillPreviewSerializer, **BAD_INPUT, **COMMON_ERRORS, **NOT_FOUND})
@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def kill_request_preview(request: Request) -> Response:
    """What a request would target, without filing it (the same checks as filing)."""
    params = request.query_params
    try:
        host = services.get_host(params.get("host", ""))
        if workload := params.get("workload", ""):
            result = services.preview(host, None, None, workload=workload)
        else:
            result = services.preview(
                host, _int(params.get("pid"), "pid"),
                _int(params.get("start_time_ticks"), "start_time_ticks"),
                include_descendants=_bool(params.get("include_descendants"), "include_descendants"),
            )
    except KillError as error:
        return _error(error)
    return Response(preview_data(result))


@extend_schema(summary="One kill request with its steps", tags=["kills"],
               responses={200: KillRequestDetailSerializer, **COMMON_ERRORS, **NOT_FOUND})
@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def kill_request_detail(request: Request, pk: int) -> Response:
    try:
        return Response(detail_data(services.get_request(pk)))
    except KillError as error:
        return _error(error)


def _decide(pk: int, decision: Callable[[], object]) -> Response:
    """Run one decision on request ``pk`` and answer with the request as it now is."""
    try:
        decision()
        return Response(detail_data(services.get_request(pk)))
    except KillError as error:
        return _error(error)


def _reason(request: Request) -> str:
    reason = _body(request).get("reason")
    return reason if isinstance(reason, str) else ""


def _recent_authentication_missing(request: Request, pk: int) -> Response | None:
    """Why this approval needs a fresher authentication (gpuadmin/accounts/sudo.py), or None.

    With a session: a login or re-authentication within the last 15 minutes
    (and with TOTP when required), as on the pages. With an API token: the
    token is the credential; when TOTP is required the body carries a current
    code as ``totp``.
    """
    if isinstance(request.auth, get_token_model()):
        if sudo.totp_required() and not sudo.check_totp(request.user, str(_body(request).get("totp") or "")):
            message = "approving needs a current TOTP code in the body as \"totp\""
            return Response({"error": message, "detail": message}, status=403)
        return None
    if sudo.recently_authenticated(request._request):
        return None
    message = "approving needs a recent authentication: enter your password again at reauth_url"
    url = sudo.reauth_url(reverse("kill_request_detail", args=[pk]))
    return Response({"error": message, "detail": message, "reauth_url": url}, status=403)


@extend_schema(summary="Approve (role approver, not the requester)", tags=["kills"],
               request=body({"allow_sigkill_only": BOOLEAN, "totp": STRING}), responses=DECISION_RESPONSES)
@api_view(["POST"])
@renderer_classes([AsciiJSONRenderer])
def approve(request: Request, pk: str) -> Response:
    try:
        missing = _recent_authentication_missing(request, int(pk))
    except KillError as error:
        return _error(error)
    if missing is not None:
        return missing

    def decision() -> None:
        allow = _bool(_body(request).get("allow_sigkill_only", False), "allow_sigkill_only")
        services.approve(int(pk), request.user, allow_sigkill_only=allow)

    return _decide(int(pk), decision)


@extend_schema(summary="Reject (role approver)", tags=["kills"], request=body({"reason": STRING}),
               responses=DECISION_RESPONSES)
@api_view(["POST"])
@renderer_classes([AsciiJSONRenderer])
def reject(request: Request, pk: str) -> Response:
    return _decide(int(pk), lambda: services.reject(int(pk), request.user, _reason(request)))


@extend_schema(summary="Cancel (the requester, or an approver)", tags=["kills"],
               request=body({"reason": STRING}), responses=DECISION_RESPONSES)
@api_view(["POST"])
@renderer_classes([AsciiJSONRenderer])
def cancel(request: Request, pk: str) -> Response:
    return _decide(int(pk), lambda: services.cancel(int(pk), request.user, _reason(request)))
