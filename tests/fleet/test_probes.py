"""Central's probes (gpuadmin/fleet/probes.py): who is due one, and "probe now".

Probes are captured at ``app.send_task`` (the broker is not under test here;
tests/integration runs real workers), plus one real kombu message through the
in-memory transport to see ``expires`` land in the message itself.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from kombu import Connection

from gpuadmin.celery import app
from gpuadmin.fleet.models import Host
from gpuadmin.fleet.probes import ProbeTooSoon, probe_now, send_due_probes
from gpuadmin.wire.task_names import PROBE_HOST
from tests.fleet.helpers import T0, at

pytestmark = pytest.mark.django_db


def host_last_seen(name: str, last_seen_at: datetime) -> Host:
    return Host.objects.create(
        name=name, first_seen_at=last_seen_at - timedelta(days=1), last_seen_at=last_seen_at
    )


def probed(calls: list[dict[str, Any]]) -> list[str]:
    return sorted(c["queue"] for c in calls)


def test_every_host_gets_a_probe_on_its_own_queue_that_expires_after_one_interval(
    sent: list[dict[str, Any]],
) -> None:
    host_last_seen("gpu01", at(-5))
    host_last_seen("gpu02", at(-30 * 60))  # offline half an hour: still every interval
    with override_settings(GPUADMIN_PROBE_INTERVAL_SECONDS=7):
        assert send_due_probes(at(0)) == ["gpu01", "gpu02"]
    assert probed(sent) == ["host.gpu01", "host.gpu02"]
    assert all(c["name"] == PROBE_HOST and c["expires"] == 7 for c in sent)
    # One producer for the round (sending.request_probes): taking the pool's for each host cost as much
    # again as the publish itself.
    assert len({id(c["producer"]) for c in sent}) == 1 and sent[0]["producer"] is not None
    # Hosts heard from within the hour are asked every interval whatever it says: their rows are not
    # written (ingest holds them).
    assert set(Host.objects.values_list("last_probe_sent_at", flat=True)) == {None}


def test_hosts_offline_for_over_an_hour_are_probed_once_a_minute(sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", at(-5))
    host_last_seen("dead", at(-2 * 3600))
    interval = settings.GPUADMIN_PROBE_INTERVAL_SECONDS
    per_tick = []
    for tick in range(13):  # two minutes of beat ticks
        sent.clear()
        send_due_probes(at(tick * interval))
        per_tick.append(probed(sent))
    dead_ticks = [i for i, queues in enumerate(per_tick) if "host.dead" in queues]
    assert dead_ticks == [0, 60 // interval, 120 // interval]
    # What its cadence is kept by, recorded for it alone.
    assert dict(Host.objects.values_list("name", "last_probe_sent_at")) == {"gpu01": None, "dead": at(120)}
    assert all("host.gpu01" in queues for queues in per_tick)
    assert all(c["expires"] == interval for c in sent)


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
    assert Host.objects.get().last_probe_sent_at == at(0)


def test_probe_now_goes_at_most_once_per_probe_interval_per_host(sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", at(-5))
    host_last_seen("gpu02", at(-5))
    interval = settings.GPUADMIN_PROBE_INTERVAL_SECONDS
    probe_now("gpu01", now=at(0))
    with pytest.raises(ProbeTooSoon, match=f"try again in {interval - 3} s") as refused:
        probe_now("gpu01", now=at(3))
    assert refused.value.seconds_left == interval - 3
    probe_now("gpu02", now=at(3))  # another host has its own slot
    # Scheduled probes do not use up the slot; only pressing the button does.
    send_due_probes(at(interval - 1))
    probe_now("gpu01", now=at(interval))
    assert probed(sent) == ["host.gpu01", "host.gpu01", "host.gpu01", "host.gpu02", "host.gpu02"]


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
