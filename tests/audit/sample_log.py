"""A small audit log with known hosts, people, owners, actions and dates, for filter tests."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from gpuadmin.audit import log
from gpuadmin.audit.models import Action

# sequence: (time, action, host, requester, approver, process owners, request)
SAMPLE = {
    1: (datetime(2025, 3, 1, 10, 0, tzinfo=UTC), Action.REQUESTED, "gpu1", "alice", "", ["carol"], 1),
    2: (datetime(2025, 3, 1, 10, 5, tzinfo=UTC), Action.APPROVED, "gpu1", "alice", "bob", ["carol"], 1),
    3: (datetime(2025, 3, 2, 9, 0, tzinfo=UTC), Action.SIGNAL_SENT, "gpu1", "alice", "bob", ["carol"], 1),
    4: (datetime(2025, 3, 3, 12, 0, tzinfo=UTC), Action.REQUESTED, "gpu2", "dave", "", ["carol", "erin"], 2),
    5: (datetime(2025, 3, 4, 8, 0, tzinfo=UTC), Action.REJECTED, "gpu2", "dave", "bob", ["erin"], 2),
    # "caroline" must not match a filter for "carol".
    6: (datetime(2025, 3, 5, 0, 30, tzinfo=UTC), Action.REQUESTED, "gpu2", "alice", "", ["caroline"], 3),
}


def record_at(monkeypatch: pytest.MonkeyPatch, when: datetime, action: str, **fields) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(timezone, "now", lambda: when)
        log.record(action, **fields)


@pytest.fixture
def sample_log(db: None, monkeypatch: pytest.MonkeyPatch) -> dict:
    for when, action, host, requester, approver, owners, request_id in SAMPLE.values():
        record_at(
            monkeypatch,
            when,
            action,
            host_name=host,
            requester_name=requester,
            approver_name=approver,
            process_users=owners,
            kill_request_id=request_id,
            targets_summary=f"pid {4000 + request_id} python ({owners[0]})",
        )
    return SAMPLE


# (query, sequences expected, newest first)
FILTER_CASES = [
    ({}, [6, 5, 4, 3, 2, 1]),
    ({"host": "gpu2"}, [6, 5, 4]),
    ({"requester": "alice"}, [6, 3, 2, 1]),
    ({"approver": "bob"}, [5, 3, 2]),
    ({"process_user": "carol"}, [4, 3, 2, 1]),
    ({"process_user": "erin"}, [5, 4]),
    ({"action": "requested"}, [6, 4, 1]),
    ({"kill_request": "2"}, [5, 4]),
    ({"from": "2025-03-02", "to": "2025-03-04"}, [5, 4, 3]),
    ({"from": "2025-03-05"}, [6]),
    ({"to": "2025-03-01"}, [2, 1]),
    ({"host": "gpu2", "process_user": "erin", "action": "rejected"}, [5]),
    ({"host": "gpu3"}, []),
]
FILTER_IDS = ["none", "host", "requester", "approver", "owner", "owner2", "action", "request", "dates",
              "from", "to", "combined", "nothing"]
