"""What central and the agent send each other (gpuadmin/sending.py), as the broker receives it: the test
settings' embedded broker, read back with kombu. Workers taking them: tests/integration."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from kombu.message import Message

from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, app, host_queue
from gpuadmin.sending import (
    probe_expiry_seconds,
    request_probe,
    send_snapshot,
    send_snapshot_update,
    snapshot_expiry_seconds,
)
from gpuadmin.wire.signing import (
    BadMessage,
    MessageKind,
    envelope_text,
    generate_private_key,
    open_envelope,
    seal,
)
from gpuadmin.wire.task_names import INGEST_SNAPSHOT, INGEST_SNAPSHOT_UPDATE, PROBE_HOST


def taken(queue_name: str, *, marker: str = "", read: Callable[[Any], str] = str) -> Message:
    """The one message in ``queue_name`` (whose body, as ``read`` gives it, holds ``marker``: central's
    queues may hold what earlier tests in this process left there, taken away with it)."""
    with app.connection_for_read() as connection, connection.SimpleQueue(queue_name) as queue:
        messages = [queue.get(timeout=5)]
        while queue.qsize():
            messages.append(queue.get(timeout=5))
        for message in messages:
            message.ack()
    ours = [message for message in messages if marker in read(message.decode())]
    assert len(ours) == 1, f"{len(ours)} messages of this test in {queue_name}"
    return ours[0]


def test_a_probe_request_goes_to_its_hosts_queue_expiring_within_one_interval() -> None:
    name = f"gpu-ask-{uuid.uuid4().hex[:8]}"
    request_probe(name)
    plain = taken(host_queue(name))
    request_probe(name, full=True)
    full = taken(host_queue(name))

    assert plain.headers["task"] == full.headers["task"] == PROBE_HOST
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    # Only an ask for a full snapshot says so: a plain request stays what older agents read.
    assert (plain.decode(), full.decode()) == ([[], {}, embed], [[], {"full": True}, embed])
    interval = timedelta(seconds=probe_expiry_seconds())
    for message in (plain, full):
        expires = datetime.fromisoformat(message.headers["expires"])
        assert timedelta(0) < expires - datetime.now(expires.tzinfo) <= interval


def test_snapshots_and_updates_go_to_centrals_two_queues_expiring_after_the_offline_window() -> None:
    marker = uuid.uuid4().hex
    message = seal({"test": marker, "padding": ["the same row"] * 100}, MessageKind.SNAPSHOT,
                   generate_private_key())
    send_snapshot(message)
    send_snapshot_update(message)
    snapshot = taken(CENTRAL_QUEUE, marker=marker, read=inflated)
    update = taken(CENTRAL_UPDATES_QUEUE, marker=marker)

    assert (snapshot.headers["task"], update.headers["task"]) == (INGEST_SNAPSHOT, INGEST_SNAPSHOT_UPDATE)
    # A full snapshot travels compressed, the same signed text; an update as it was sealed.
    [[sent_snapshot]] = snapshot.decode()[:1]
    assert "text" not in sent_snapshot and len(sent_snapshot["zlib"]) < len(message["text"]) / 4
    assert open_envelope(sent_snapshot, MessageKind.SNAPSHOT).text == message["text"]
    assert update.decode()[0] == [message]
    window = timedelta(seconds=snapshot_expiry_seconds())
    for sent in (snapshot, update):
        left = datetime.fromisoformat(sent.headers["expires"]) - datetime.now(UTC)
        assert window - timedelta(seconds=30) < left <= window


def inflated(body: Any) -> str:
    """A task's body as text, its first argument's envelope inflated when it is one."""
    try:
        return envelope_text(body[0][0])
    except (BadMessage, LookupError, TypeError, AttributeError):
        return str(body)
