"""Central's probes (gpuadmin/fleet/probes.py): "probe now".

Probes are captured at ``app.send_task`` (the broker is not under test here;
tests/integration runs real workers), plus one real kombu message through the
in-memory transport to see ``expires`` land in the message itself.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection

from gpuadmin.celery import app
from gpuadmin.fleet.models import Host
from gpuadmin.fleet.probes import ProbeTooSoon, probe_now
from gpuadmin.wire.task_names import PROBE_HOST
from tests.fleet.helpers import T0, at

pytestmark = pytest.mark.django_db


def host_last_seen(name: str, last_seen_at: datetime) -> Host:
    return Host.objects.create(
        name=name, first_seen_at=last_seen_at - timedelta(days=1), last_seen_at=last_seen_at
    )


def probed(calls: list[dict[str, Any]]) -> list[str]:
    return sorted(c["queue"] for c in calls)


def test_probe_now_sends_one_expiring_probe_and_records_it(sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", at(-7200))
    probe_now("gpu01", now=at(0))
    assert sent == [
        {
            "name": PROBE_HOST,
            "args": (),
            "queue": "host.gpu01",
            "expires": settings.GPUADMIN_PROBE_INTERVAL_SECONDS,
        }
    ]
    assert Host.objects.get().probe_now_sent_at == at(0)


def test_probe_now_goes_at_most_once_per_probe_interval_per_host(sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", at(-5))
    host_last_seen("gpu02", at(-5))
    interval = settings.GPUADMIN_PROBE_INTERVAL_SECONDS
    probe_now("gpu01", now=at(0))
    with pytest.raises(ProbeTooSoon, match=f"try again in {interval - 3} s") as refused:
        probe_now("gpu01", now=at(3))
    assert refused.value.seconds_left == interval - 3
    probe_now("gpu02", now=at(3))  # another host has its own slot
    probe_now("gpu01", now=at(interval))
    assert probed(sent) == ["host.gpu01", "host.gpu01", "host.gpu02"]


def test_a_probe_now_that_could_not_be_sent_frees_the_slot(monkeypatch: pytest.MonkeyPatch,
                                                            sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", at(-5))

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(app, "send_task", broker_down)
    with pytest.raises(ConnectionError):
        probe_now("gpu01", now=at(0))
    assert Host.objects.get().probe_now_sent_at is None
    monkeypatch.undo()
    monkeypatch.setattr(app, "send_task", lambda name, *a, **kw: sent.append({"queue": kw["queue"]}))
    probe_now("gpu01", now=at(1))
    assert sent == [{"queue": "host.gpu01"}]


def test_the_probe_message_itself_carries_the_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    original = app.send_task
    with Connection("memory://") as connection:
        monkeypatch.setattr(app, "send_task", lambda *a, **kw: original(*a, connection=connection, **kw))
        host_last_seen("gpu-mem", datetime.now(T0.tzinfo))
        before = datetime.now(T0.tzinfo)
        probe_now("gpu-mem")
        with connection.SimpleQueue("host.gpu-mem") as queue:
            message = queue.get(timeout=2)
            message.ack()
    assert message.headers["task"] == PROBE_HOST
    expires = datetime.fromisoformat(message.headers["expires"])
    interval = timedelta(seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
    assert before + interval - timedelta(seconds=1) <= expires <= datetime.now(T0.tzinfo) + interval
