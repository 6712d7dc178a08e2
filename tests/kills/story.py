"""One finished kill, told through the real services, for tests that read its audit trail.

The lab host's launcher (PID 4120, alice, 10 GiB on GPU 0) is filed by the
requester, approved by the approver (the order goes to a recorder instead of
a broker: the broker is not under test here), started, sent SIGINT, exits,
finishes, and a later snapshot confirms the memory came back — the events a
real agent reports (tests/kills/test_progress.py), in its order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from django.test import TestCase
from django.utils import timezone

from gpuadmin.celery import app
from gpuadmin.fleet.ingest import ingest_snapshot
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from tests.kills.conftest import store_snapshot
from tests.kills.lab import lab_snapshot

PID = 4120
REASON = "orphaned worker holds 10 GiB on GPU 0"
PLAN = [{"signal": "SIGINT", "grace_seconds": 10}, {"signal": "SIGTERM", "grace_seconds": 20},
        {"signal": "SIGKILL", "grace_seconds": 30}]
EXIT_DETAIL = "exited (after SIGINT, 0.31 s after it was sent)"


@dataclass
class Story:
    kill_request: KillRequest
    orders: list[dict[str, Any]]


def _committed():
    # Runs what waits for the commit (the order's send, the snapshot's receivers) in
    # tests inside a transaction; with no transaction they run at once anyway.
    return TestCase.captureOnCommitCallbacks(execute=True)


def finished_kill(requester: Any, approver: Any) -> Story:
    """File, approve, run and settle one kill; return the request (refreshed) and the orders sent."""
    store_snapshot(lab_snapshot(taken_at=timezone.now() - timedelta(seconds=60)))
    orders: list[dict[str, Any]] = []

    def record_send(name: str, args: Any = None, **options: Any) -> None:
        orders.append(args[0])

    kill_request = services.file_request(requester, host="gpu01", pid=PID, start_time_ticks=PID * 100,
                                         reason=REASON, plan=PLAN)
    with mock.patch.object(app, "send_task", record_send), _committed():
        services.approve(kill_request.pk, approver)
    kill_request.refresh_from_db()

    finished_at = datetime.now(UTC) - timedelta(seconds=2)

    def report(seq: int, kind: str, **fields: Any) -> None:
        services.record_progress({
            "request_id": kill_request.order_request_id, "seq": seq, "event": kind,
            "at": (finished_at - timedelta(seconds=(4 - seq) * 0.25)).isoformat(),
            "pid": None, "start_time_ticks": None, "signal": None, "method": None, "detail": "", **fields,
        })

    target = {"pid": PID, "start_time_ticks": PID * 100, "method": "pidfd"}
    report(1, "started", detail=f"executing {len(PLAN)} steps on 1 target(s)")
    report(2, "signal_sent", signal="SIGINT", detail="sent SIGINT (step 1 of 3; grace 10 s)", **target)
    report(3, "target_exited", signal="SIGINT", detail=EXIT_DETAIL, **target)
    report(4, "finished", result="succeeded", detail="every target not refused is gone (1 exited)",
           targets=[{"pid": PID, "start_time_ticks": PID * 100, "user": "alice", "name": "python",
                     "outcome": "exited", "signals_sent": ["SIGINT"], "method": "pidfd",
                     "detail": EXIT_DETAIL}])
    kill_request.refresh_from_db()

    later = lab_snapshot(drop=(PID,))
    taken_at = kill_request.finished_at + timedelta(seconds=1)
    later["taken_at"] = taken_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with _committed():
        ingest_snapshot(json.dumps(later), received_at=taken_at + timedelta(seconds=1))
    kill_request.refresh_from_db()
    return Story(kill_request=kill_request, orders=orders)
