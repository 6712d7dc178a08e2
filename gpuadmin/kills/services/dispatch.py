"""Sending an approved request to its host as a self-contained kill order.

The order is signed with central's key (``gpuadmin.keys``): agents execute
nothing else. It leaves only after the approval committed (``transaction.on_commit``),
so a rolled-back approval never reaches a host. ``dispatched_at`` is set once
the broker accepted the message, in the transaction that holds the request's
row lock across the publish (a cancel waits for it); the sweeper re-sends
approved orders that never left. A second copy (the broker took it, then the
commit failed) is harmless: the agent's journal executes a request id once.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from gpuadmin.audit.anchors import newest_envelope
from gpuadmin.audit.models import Action
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.keys import central_signing_key
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.states import Status
from gpuadmin.wire.kill_protocol import ORDER_VERSION, SELF_SERVICE_ORDER_VERSION
from gpuadmin.wire.signing import MessageKind, seal
from gpuadmin.wire.task_names import EXECUTE_KILL_ORDER
from gpuadmin.wire.timestamps import wire_time

logger = logging.getLogger(__name__)

# Publishing waits at most about this long for a broker that is down; the
# sweeper tries again later instead of holding the approver's page, or the
# request's row lock that send_order holds across the publish.
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def host_deadline(kill_request: KillRequest) -> datetime:
    """The start deadline on the host's clock: central's, moved by the host's measured clock offset.

    The agent compares only this with its own clock, so a host clock ahead of
    central's does not expire a fresh order and one behind does not start a
    late one (docs/kill-order.md, *Clocks*).
    """
    assert kill_request.start_deadline
    return kill_request.start_deadline + LatestSnapshot.objects.clock_ahead_at_least(kill_request.host)


def build_order(kill_request: KillRequest) -> dict[str, Any]:
    """The order (docs/kill-order.md): everything the agent needs, nothing it must look up."""
    assert kill_request.start_deadline and kill_request.decided_at
    order = {
        "order_version": ORDER_VERSION,
        "request_id": kill_request.order_request_id,
        "host": kill_request.host.name,
        "boot_id": kill_request.boot_id,
        "deadline": wire_time(kill_request.start_deadline),
        "host_deadline": wire_time(host_deadline(kill_request)),
        "targets": [
            {
                "pid": t.pid,
                "start_time_ticks": t.start_time_ticks,
                "uid": t.uid,
                "user": t.user,
                "name": t.name,
                "cmdline_sha256": t.cmdline_sha256,
            }
            for t in kill_request.targets.all()
        ],
        "plan": kill_request.plan,
        "approved_by": kill_request.approved_by_name,
        "approved_at": wire_time(kill_request.decided_at),
        # The agent ignores it and keeps it in its journal with the order: one more copy of the
        # audit chain's signed head where central's database writers cannot reach (audit/anchors.py).
        "audit_anchor": newest_envelope(),
    }
    if kill_request.self_service:
        # No second admin approved it: the agent signals a target only while /proc shows one of
        # these uids (the targets', each checked against the person's accounts at filing).
        order.update(order_version=SELF_SERVICE_ORDER_VERSION, self_service={
            "allowed_uids": sorted({t.uid for t in kill_request.targets.all() if t.uid is not None}),
            "person": kill_request.requested_by_name,
        })
    if kill_request.is_reset:
        # Kill orders stay exactly as before (no "action": an agent reads its absence as a kill).
        order.update(action=KillRequest.Action.RESET_GPU.value, gpu={"uuid": kill_request.gpu_uuid})
    return order


def send_order(kill_request_id: int, *, now: datetime | None = None) -> bool:
    """Publish the order to the host's queue; True when the broker accepted it.

    Checks, publishes and records the outcome under the request's row lock, so a
    cancel (which takes the same lock) either comes first, and nothing is sent,
    or waits until the order has left and then finds it sent, no longer
    cancellable. Never raises for a broker failure: it is recorded on the
    request and the sweeper retries while the start deadline allows.
    """
    from gpuadmin.celery import host_queue

    now = now or timezone.now()
    with transaction.atomic():
        kill_request = KillRequest.objects.locked(kill_request_id)
        if not _may_send(kill_request, now):
            return False
        order = build_order(kill_request)
        queue = host_queue(kill_request.host.name)
        # The lock spans the publish: released before it, a cancel could commit while
        # the order is on its way, and the host would execute a cancelled request.
        # Holding it is bounded: the publish retries only as PUBLISH_RETRY_POLICY allows.
        try:
            _publish(order, queue)
        except Exception as exc:  # any broker/transport failure: kombu, redis, socket errors
            _record_failure(kill_request, queue, exc)
            return False
        _record_sent(kill_request, queue, order)
    return True


def _may_send(kill_request: KillRequest, now: datetime) -> bool:
    """Approved, never sent, still before its start deadline, to a host whose key is accepted."""
    if kill_request.status != Status.APPROVED or kill_request.dispatched_at is not None:
        return False  # cancelled, already sent, or closed otherwise
    if kill_request.start_deadline is None or kill_request.start_deadline <= now:
        return False  # too late: the sweeper expires it
    if not kill_request.host.key_accepted:
        # Filing refuses such hosts; a key forgotten since the approval stops the order here.
        logger.warning("kill request %s: host %s has no accepted key; order not sent",
                       kill_request.pk, kill_request.host.name)
        return False
    return True


def _publish(order: dict[str, Any], queue: str) -> None:
    """Sign the order and hand it to the broker for the host's queue; raises what the broker raised."""
    from gpuadmin.celery import app

    message = seal(order, MessageKind.ORDER, central_signing_key())
    # Celery's own expiry is checked by the agent's worker on the host's clock too.
    expires = datetime.fromisoformat(order["host_deadline"])
    app.send_task(
        EXECUTE_KILL_ORDER, args=[message], queue=queue, expires=expires,
        retry=True, retry_policy=PUBLISH_RETRY_POLICY,
    )


def _record_failure(kill_request: KillRequest, queue: str, exc: Exception) -> None:
    logger.warning("kill request %s: order not sent to %s: %s", kill_request.pk, queue, exc)
    kill_request.dispatch_attempts += 1
    kill_request.last_dispatch_error = f"{type(exc).__name__}: {exc}"[:2000]
    kill_request.save(update_fields=["dispatch_attempts", "last_dispatch_error"])


def _record_sent(kill_request: KillRequest, queue: str, order: dict[str, Any]) -> None:
    kill_request.dispatch_attempts += 1
    kill_request.dispatched_at = timezone.now()
    kill_request.last_dispatch_error = ""
    kill_request.save(update_fields=["dispatched_at", "dispatch_attempts", "last_dispatch_error"])
    audit(Action.DISPATCHED, kill_request, details={"queue": queue, "attempt": kill_request.dispatch_attempts,
                                                    "deadline": order["deadline"]})


def dispatch_after_commit(kill_request_id: int) -> None:
    """Send the order once the surrounding transaction (the approval) has committed."""
    transaction.on_commit(lambda: send_order(kill_request_id), robust=True)
