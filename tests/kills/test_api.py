"""The kill request API: the contract scripts rely on (docs/api.md, "Kill requests")."""

from __future__ import annotations

import pytest
from knox.models import AuthToken
from rest_framework.test import APIClient

from gpuadmin.accounts.roles import Role
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from tests.people import make_person

pytestmark = pytest.mark.django_db

KILL_THEN_INT = [{"signal": "SIGKILL", "grace_seconds": 1}, {"signal": "SIGINT", "grace_seconds": 1}]

URL = "/api/v1/kill-requests/"
REASON = "job finished yesterday, memory still held"


def client_for(user) -> APIClient:
    """A script's client: an API token (approving with a session needs a recent login, tests/accounts)."""
    client = APIClient()
    _, key = AuthToken.objects.create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def body(pid: int, **extra: object) -> dict:
    return {"host": "gpu01", "pid": pid, "start_time_ticks": pid * 100, "reason": REASON, **extra}


@pytest.fixture
def filed(lab, requester) -> dict:
    response = client_for(requester).post(URL, body(4120, include_descendants=True), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_filing_answers_201_with_id_status_targets_and_plan(filed):
    assert filed["status"] == "pending"
    assert isinstance(filed["id"], int)
    assert [t["pid"] for t in filed["targets"]] == [4120, 4121, 4123]
    assert filed["targets"][0]["start_time_ticks"] == 412000
    assert filed["plan"][0] == {"signal": "SIGINT", "grace_seconds": 10}
    assert {e["pid"] for e in filed["excluded_targets"]} == {4122, 4124}
    assert filed["steps"] == []


@pytest.mark.usefixtures("lab")
def test_a_zombie_answers_422_with_the_parent_offered(requester):
    response = client_for(requester).post(URL, body(4200), format="json")
    assert response.status_code == 422
    data = response.json()
    assert "zombie" in data["error"] and data["detail"] == data["error"]
    assert data["parent_offer"]["pid"] == 4199
    assert data["parent_offer"]["zombie_count"] == 3


@pytest.mark.usefixtures("lab")
@pytest.mark.parametrize(
    ("payload", "status", "says"),
    [
        (body(4600, reason=""), 400, "reason is required"),
        (body(4600, plan=KILL_THEN_INT), 400, "SIGKILL can only be the last step"),
        ({**body(4600), "pid": "4600; rm -rf /"}, 400, "pid must be a non-negative integer"),
        (body(4600, include_descendants="maybe"), 400, "include_descendants must be true or false"),
        ({**body(4600), "host": "gpu99"}, 404, "no host named 'gpu99'"),
        (body(1), 422, "PID 1"),
        (body(4242), 422, "agent itself"),
        ([1, 2, 3], 400, "must be a JSON object"),
    ],
)
def test_bad_requests_answer_4xx_saying_why(requester, payload, status, says):
    response = client_for(requester).post(URL, payload, format="json")
    assert response.status_code == status
    assert says in response.json()["error"]
    assert KillRequest.objects.count() == 0


@pytest.mark.usefixtures("lab")
def test_a_viewer_cannot_file(viewer):
    response = client_for(viewer).post(URL, body(4600), format="json")
    assert response.status_code == 403


@pytest.mark.usefixtures("lab")
def test_without_credentials_nothing_is_answered():
    assert APIClient().get(URL).status_code == 401


def test_self_approval_is_forbidden(lab):
    both = make_person("bo", Role.REQUESTER, Role.APPROVER)
    client = client_for(both)
    created = client.post(URL, body(4600), format="json").json()
    response = client.post(f"{URL}{created['id']}/approve", {}, format="json")
    assert response.status_code == 403
    assert "a different approver must approve it" in response.json()["error"]
    assert KillRequest.objects.get().status == Status.PENDING


def test_an_approver_approves_and_the_request_shows_it(
    filed, approver, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(approver).post(f"{URL}{filed['id']}/approve", {}, format="json")
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "approved"
    assert data["approved_by"] == "april"
    assert len(sent.orders()) == 1  # sent once the approval committed
    assert client_for(approver).get(f"{URL}{filed['id']}/").json()["dispatched_at"] is not None
    again = client_for(approver).post(f"{URL}{filed['id']}/approve/", {}, format="json")
    assert again.status_code == 409
    assert "already approved" in again.json()["error"]


def test_reject_needs_a_reason(filed, approver):
    client = client_for(approver)
    assert client.post(f"{URL}{filed['id']}/reject", {}, format="json").status_code == 400
    response = client.post(f"{URL}{filed['id']}/reject", {"reason": "ask carol first"}, format="json")
    assert response.status_code == 200
    assert response.json()["status"] == "rejected"
    assert response.json()["decision_reason"] == "ask carol first"


def test_the_requester_cancels(filed, requester):
    response = client_for(requester).post(f"{URL}{filed['id']}/cancel", {}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_status_and_steps_so_far(filed, viewer, approver, sent):
    from gpuadmin.kills import services

    client_for(approver).post(f"{URL}{filed['id']}/approve", {}, format="json")
    order_id = KillRequest.objects.get(pk=filed["id"]).order_request_id
    services.record_progress({"request_id": order_id, "seq": 1, "event": "started",
                              "at": "2030-01-01T00:00:00Z", "detail": "executing"})
    services.record_progress({"request_id": order_id, "seq": 2, "event": "signal_sent", "pid": 4120,
                              "start_time_ticks": 412000, "signal": "SIGINT", "method": "pidfd",
                              "at": "2030-01-01T00:00:00.010Z", "detail": "sent SIGINT"})
    data = client_for(viewer).get(f"{URL}{filed['id']}/").json()
    assert data["status"] == "running"
    assert [(s["seq"], s["event"], s["signal"]) for s in data["steps"]] == [
        (1, "started", None), (2, "signal_sent", "SIGINT")
    ]
    assert data["targets"][0]["outcome"] == "signalled"


def test_a_pending_request_shows_its_targets_against_the_newest_snapshot(filed, viewer):
    from tests.kills.helpers import lab_snapshot, store_snapshot

    store_snapshot(lab_snapshot(drop=(4123,)))
    data = client_for(viewer).get(f"{URL}{filed['id']}/").json()
    now = {t["pid"]: t for t in data["targets_now"]}
    assert now[4123]["gone"] is True and now[4120]["gone"] is False


def test_the_list_filters_by_status(filed, viewer):
    client = client_for(viewer)
    assert [k["id"] for k in client.get(URL, {"status": "pending"}).json()] == [filed["id"]]
    assert client.get(URL, {"status": "running"}).json() == []
    assert client.get(URL, {"status": "bogus"}).status_code == 400


@pytest.mark.usefixtures("lab")
def test_preview_shows_targets_without_filing(viewer):
    data = client_for(viewer).get(f"{URL}preview", {"host": "gpu01", "pid": 4120, "start_time_ticks": 412000,
                                                     "include_descendants": "true"}).json()
    assert data["ok"] is True
    assert [t["pid"] for t in data["targets"]] == [4120, 4121, 4123]
    assert KillRequest.objects.count() == 0


def test_an_unknown_request_is_404(db, viewer):
    assert client_for(viewer).get(f"{URL}999/").status_code == 404
