"""What central and the agent send each other (gpuadmin/sending.py), as the broker receives it: the test
settings' embedded broker, read back with kombu. Workers taking them: tests/integration."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from kombu.message import Message

from gpuadmin.celery import app, host_queue
from gpuadmin.sending import probe_expiry_seconds, request_probe, request_probes
from gpuadmin.wire.task_names import PROBE_HOST

# What differs between two messages of the same task by design: their ids, and the moment they expire.
OWN = {"id", "root_id", "expires", "correlation_id", "delivery_tag", "delivery_info"}


def taken(queue_name: str) -> Message:
    with app.connection_for_read() as connection, connection.SimpleQueue(queue_name) as queue:
        message = queue.get(timeout=5)
        message.ack()
        assert not queue.qsize(), f"more than one message in {queue_name}"
        return message


def alike(message: Message) -> dict[str, Any]:
    return {"headers": {k: v for k, v in message.headers.items() if k not in OWN},
            "properties": {k: v for k, v in message.properties.items() if k not in OWN},
            "body": message.decode(), "content_type": message.content_type}


def test_a_round_of_probe_requests_sends_each_host_what_request_probe_sends_it() -> None:
    names = [f"gpu-round-{uuid.uuid4().hex[:8]}-{n}" for n in range(3)]
    request_probe(names[0])
    alone = taken(host_queue(names[0]))
    request_probes(names)
    round_ = [taken(host_queue(name)) for name in names]

    assert alone.headers["task"] == PROBE_HOST and alone.decode() == [[], {}, {
        "callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    assert [alike(message) for message in round_] == [alike(alone)] * 3
    # Each its own id; expiring one interval after it was sent, as request_probe's does.
    ids = [message.headers["id"] for message in round_]
    assert len({*ids, alone.headers["id"]}) == 4
    assert all(m.headers["root_id"] == m.properties["correlation_id"] == m.headers["id"] for m in round_)
    interval = timedelta(seconds=probe_expiry_seconds())
    expires = [datetime.fromisoformat(m.headers["expires"]) for m in (alone, *round_)]
    assert max(expires) - min(expires) < interval
