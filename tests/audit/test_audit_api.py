"""GET /api/v1/audit/ (filters as on the page, paginated) and GET /api/v1/audit/verify."""

from __future__ import annotations

import pytest
from django.test import Client
from knox.models import AuthToken

from tests.audit.helpers import FILTER_CASES, FILTER_IDS, audit_table, tamper

pytestmark = pytest.mark.django_db

LIST_URL = "/api/v1/audit/"
VERIFY_URL = "/api/v1/audit/verify"


@pytest.mark.parametrize("url", [LIST_URL, VERIFY_URL])
def test_anonymous_gets_401_and_no_role_gets_403(client: Client, stranger, url: str):
    anonymous = client.get(url)
    assert anonymous.status_code == 401
    assert "detail" in anonymous.json()
    client.force_login(stranger)
    assert client.get(url).status_code == 403


def test_a_token_is_enough(client: Client, viewer, record_events):
    record_events(1)
    _, key = AuthToken.objects.create(user=viewer)
    response = client.get(LIST_URL, headers={"Authorization": f"Token {key}"})
    assert response.status_code == 200
    assert response.json()["count"] == 1


def test_event_shape(viewer_client: Client, make_user, record_events):
    from gpuadmin.audit import log

    bob = make_user("bob")
    event = log.record(
        "approved",
        actor=bob,
        kill_request_id=12,
        host_name="gpu-07",
        requester_name="alice",
        approver_name="bob",
        process_users=["erin", "carol"],
        targets_summary="pid 4120 python\u202e (carol) +1",
        details={"plan": [{"signal": "SIGINT", "grace_seconds": 10}]},
    )
    response = viewer_client.get(LIST_URL)
    assert b"python\\u202e (carol)" in response.content  # escaped, never the raw override
    body = response.json()

    assert body == {
        "count": 1,
        "next": None,
        "previous": None,
        "results": [
            {
                "sequence": 1,
                "created_at": event.created_at.isoformat(timespec="microseconds").replace("+00:00", "Z"),
                "action": "approved",
                "actor": "bob",
                "actor_id": bob.pk,
                "kill_request_id": 12,
                "host": "gpu-07",
                "requester": "alice",
                "approver": "bob",
                "process_users": ["carol", "erin"],
                "targets_summary": "pid 4120 python\u202e (carol) +1",
                "details": {"plan": [{"grace_seconds": 10, "signal": "SIGINT"}]},
                "previous_hash": "0" * 64,
                "hash": event.hash,
                # The raw fields stay; the sentence is added for reading.
                "sentence": "bob approved #12 (requested by alice)",
            }
        ],
    }


@pytest.mark.parametrize(("query", "expected"), FILTER_CASES, ids=FILTER_IDS)
def test_filters_match_the_page(viewer_client: Client, sample_log, query: dict, expected: list[int]):
    body = viewer_client.get(LIST_URL, query).json()
    assert [e["sequence"] for e in body["results"]] == expected
    assert body["count"] == len(expected)


def test_pagination(viewer_client: Client, record_events):
    record_events(120)
    first = viewer_client.get(LIST_URL).json()
    assert first["count"] == 120
    assert [e["sequence"] for e in first["results"]] == list(range(120, 70, -1))
    assert first["previous"] is None
    assert first["next"] == "http://testserver/api/v1/audit/?page=2"

    last = viewer_client.get(LIST_URL, {"page": 3, "host": "gpu1"}).json()
    assert [e["sequence"] for e in last["results"]] == list(range(20, 0, -1))
    assert last["next"] is None
    assert last["previous"] == "http://testserver/api/v1/audit/?host=gpu1&page=2"

    small = viewer_client.get(LIST_URL, {"page_size": 7}).json()
    assert len(small["results"]) == 7
    assert viewer_client.get(LIST_URL, {"page": 4}).status_code == 404


def test_invalid_filters_are_a_400_that_says_which(viewer_client: Client, sample_log):
    response = viewer_client.get(LIST_URL, {"from": "2025-13-01", "action": "nuke", "to": "2025-03-01"})
    assert response.status_code == 400
    body = response.json()
    assert body["detail"] == "Invalid filter values."
    assert set(body["errors"]) == {"from", "action"}


def test_an_end_before_the_start_is_a_400(viewer_client: Client, sample_log):
    response = viewer_client.get(LIST_URL, {"from": "2025-03-05", "to": "2025-03-01"})
    assert response.status_code == 400
    assert response.json()["errors"]["to"][0]["message"] == "The end date is before the start date."


def test_verify_ok(viewer_client: Client, record_events, anchor_file):
    events = record_events(3)
    for url in (VERIFY_URL, VERIFY_URL + "/"):
        body = viewer_client.get(url).json()
        assert body.pop("full_verified_seconds_ago") >= 0
        assert body.pop("recomputed_after") in (0, 3)
        assert body == {
            "ok": True,
            "events": 3,
            "first_bad_sequence": None,
            "problem": None,
            "head_sequence": 3,
            "head_hash": events[-1].hash,
            "anchor": {"ok": True, "sequence": None, "said": [
                f"no anchors in {anchor_file}: nothing outside the database vouches for this chain"]},
        }


def test_verify_recomputes_only_what_is_new_since_the_last_request(viewer_client: Client, record_events,
                                                                   monkeypatch):
    """Any viewer may ask as often as they like: the whole log is not re-hashed on every request."""
    from gpuadmin.audit import chain

    record_events(50)
    hashed = []
    real_hash = chain.event_hash
    monkeypatch.setattr(chain, "event_hash",
                        lambda fields: hashed.append(fields["sequence"]) or real_hash(fields))

    assert viewer_client.get(VERIFY_URL).json()["recomputed_after"] == 0
    assert len(hashed) == 50
    record_events(2)
    hashed.clear()
    body = viewer_client.get(VERIFY_URL).json()
    assert (body["ok"], body["events"], body["recomputed_after"]) == (True, 52, 50)
    assert hashed == [51, 52]


def test_verify_checks_the_newest_anchor(viewer_client: Client, record_events):
    from gpuadmin.audit import anchors

    record_events(3)
    anchors.publish()
    assert viewer_client.get(VERIFY_URL).json()["anchor"]["ok"] is True
    tamper(f"DELETE FROM {audit_table()} WHERE sequence = 3")
    body = viewer_client.get(VERIFY_URL).json()
    assert body["anchor"]["ok"] is False
    assert "event 3 is gone" in body["anchor"]["said"][0]


def test_verify_names_the_first_bad_event(viewer_client: Client, record_events):
    record_events(4)
    tamper(f"DELETE FROM {audit_table()} WHERE sequence = 2")
    body = viewer_client.get(VERIFY_URL).json()
    assert body["ok"] is False
    assert body["events"] == 3
    assert body["first_bad_sequence"] == 2
    assert body["problem"] == "gap in sequence: event 2 is missing (the next event present is 3)"
