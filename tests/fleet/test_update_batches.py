"""Snapshot updates taken in batches (gpuadmin/fleet/update_batches.py), without a worker: real kombu
messages, sent as agents send them (``gpuadmin.sending``) through kombu's in-memory broker, handed to the
batcher by a real kombu consumer. The event loop's timer is a list the test runs by hand.

A real worker taking them from Redis: tests/integration/test_update_batches.py."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from django.db import OperationalError
from kombu import Connection, Consumer
from kombu.message import Message

from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, app
from gpuadmin.fleet import update_batches
from gpuadmin.fleet.intake.updates import receive_snapshot_updates
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.fleet.update_batches import (
    BASE_RETRY_SECONDS,
    BATCH_WAIT_SECONDS,
    UpdateBatchConsumer,
    UpdateBatcher,
    consumes_central,
    retry_pause_seconds,
)
from gpuadmin.sending import send_snapshot_update
from gpuadmin.wire.task_names import INGEST_SNAPSHOT, INGEST_SNAPSHOT_UPDATE
from tests.fleet.helpers import stored_with_updates
from tests.services import RedisServer

# A flush closes Django's old connections, as a worker does between tasks: after a test that left this
# process's connection open, that touches the database.
pytestmark = pytest.mark.django_db


class Timer:
    """The event loop's timer, run by the test: ``run()`` calls what is due, in order."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def __call__(self, seconds: float, function: Callable[[], None]) -> Entry:
        entry = Entry(seconds, function)
        self.entries.append(entry)
        return entry

    @property
    def pending(self) -> list[float]:
        return [e.seconds for e in self.entries if not e.cancelled]

    def run(self, only: float | None = None) -> None:
        """Call what is pending (``only``: what was scheduled that many seconds ahead; the rest stays)."""
        entries = [e for e in self.entries if only is None or e.seconds == only]
        self.entries = [e for e in self.entries if e not in entries]
        for entry in entries:
            if not entry.cancelled:
                entry.function()


class Entry:
    def __init__(self, seconds: float, function: Callable[[], None]) -> None:
        self.seconds, self.function, self.cancelled = seconds, function, False

    def cancel(self) -> None:
        self.cancelled = True


class Recorded:
    """receive_snapshot_updates' contract, recorded: each message done; ``fail`` raises after ``done_first``
    of the next call's messages are done; a message in ``no_base`` is offered to wait for its base, and
    done (refused) when it may not; one of a host (its "host") in ``behind`` is offered to wait behind,
    untried (not in ``tried``). What is offered to wait is kept as its ``opened`` form: the message
    with ``"opened": True``, given again in its place. ``read_progress`` is ``waited_on``'s contract: what
    waits for its base still does while it is in ``no_base``, its host's progress ``moves[host]`` (each
    call's updates in ``looked``)."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.tried: list[Any] = []
        self.fail: list[BaseException] = []
        self.done_first = 0
        self.no_base: list[Any] = []
        self.looked: list[list[Any]] = []
        self.moves: dict[str, int] = {}

    def batcher(self, timer: Timer, **options: Any) -> UpdateBatcher:
        return UpdateBatcher(schedule=timer, apply=self, read_progress=self.read_progress, **options)

    def read_progress(self, waiting: list[Any]) -> list[Any]:
        self.looked.append([unopened(opened) for opened in waiting])
        return [(None, ("base", self.moves.get(opened.get("host"), 0))) if unopened(opened) in self.no_base
                else None for opened in waiting]

    def __call__(self, messages: list[Any], *, done: Callable[[int], None],
                 wait: Callable[[int, Any], bool], behind: Collection[str] = ()) -> None:
        self.batches.append([unopened(m) for m in messages])
        if self.fail:
            for index in range(self.done_first):
                done(index)
            raise self.fail.pop(0)
        for index, message in enumerate(messages):
            opened = Opened({**message, "opened": True})
            if message.get("host") in behind and wait(index, opened):
                continue
            self.tried.append(unopened(message))
            if unopened(message) not in self.no_base or not wait(index, opened):
                done(index)


class Opened(dict[str, Any]):
    """A message as Recorded keeps it opened: its host where an ``OpenedUpdate`` has it."""

    @property
    def update(self) -> SimpleNamespace:
        return SimpleNamespace(host=self.get("host"))


def unopened(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if key != "opened"}


class Broker:
    """kombu's in-memory broker; ``send`` publishes as the sending side does, ``take`` hands every
    waiting message of central.updates to a batcher through a real consumer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.connection = Connection("memory://")
        original = app.send_task
        monkeypatch.setattr(app, "send_task",
                            lambda *a, **kw: original(*a, connection=self.connection, **kw))
        self.channel = self.connection.channel()
        self.queue = app.amqp.queues[CENTRAL_UPDATES_QUEUE]
        self.queue(self.channel).declare()
        self.queue(self.channel).purge()
        self.received: list[Message] = []

    def send(self, body: Any = None, *, name: str = INGEST_SNAPSHOT_UPDATE, **options: Any) -> None:
        if name == INGEST_SNAPSHOT_UPDATE and not options:
            send_snapshot_update(body)
        else:
            app.send_task(name, args=[body], queue=CENTRAL_UPDATES_QUEUE, **options)

    def take(self, batcher: UpdateBatcher) -> list[Message]:
        taken: list[Message] = []

        def on_message(message: Message) -> None:
            taken.append(message)
            batcher.on_message(message)

        with Consumer(self.connection.channel(), queues=[self.queue], on_message=on_message,
                      accept=["json"], prefetch_count=1000):
            while True:
                try:
                    self.connection.drain_events(timeout=0.05)
                except TimeoutError:
                    break
        self.received += taken
        return taken

    def close(self) -> None:
        self.queue(self.channel).purge()
        self.connection.close()


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    broker = Broker(monkeypatch)
    yield broker
    broker.close()


@pytest.fixture
def timer() -> Timer:
    return Timer()


@pytest.fixture
def applied() -> Recorded:
    return Recorded()


def acked(messages: list[Message]) -> list[bool]:
    return [m.acknowledged for m in messages]


def test_updates_are_applied_together_when_a_batch_is_full_or_its_wait_is_over(
    broker: Broker, timer: Timer, applied: Recorded
) -> None:
    batcher = applied.batcher(timer, batch_max=3)
    for n in range(7):
        broker.send({"n": n})
    messages = broker.take(batcher)

    assert applied.batches == [[{"n": 0}, {"n": 1}, {"n": 2}], [{"n": 3}, {"n": 4}, {"n": 5}]]
    assert acked(messages) == [True] * 6 + [False]
    assert timer.pending == [BATCH_WAIT_SECONDS]  # the 7th waits for more, a little
    timer.run()
    assert applied.batches[-1] == [{"n": 6}] and all(acked(messages))
    assert timer.pending == [] and batcher.held == []


def test_without_an_event_loop_each_update_is_applied_as_it_comes(
    broker: Broker, timer: Timer, applied: Recorded
) -> None:
    batcher = applied.batcher(timer, batching=False)
    for n in range(3):
        broker.send({"n": n})
    messages = broker.take(batcher)
    assert applied.batches == [[{"n": 0}], [{"n": 1}], [{"n": 2}]]
    assert all(acked(messages)) and timer.pending == []


def test_another_tasks_message_is_acknowledged_and_never_run_an_expired_update_dropped(
    broker: Broker, timer: Timer, applied: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    batcher = applied.batcher(timer, batching=False)
    broker.send({"snapshot": 1}, name=INGEST_SNAPSHOT)
    broker.send({"n": "late"}, expires=datetime.now(UTC) - timedelta(seconds=1))
    broker.send({"n": "fresh"}, expires=datetime.now(UTC) + timedelta(seconds=60))
    with caplog.at_level(logging.INFO, logger=update_batches.__name__):
        messages = broker.take(batcher)
    assert applied.batches == [[{"n": "fresh"}]]
    assert all(acked(messages))
    assert f"message for task '{INGEST_SNAPSHOT}'" in caplog.text
    assert "dropped an expired snapshot update" in caplog.text


def test_a_message_that_is_not_a_task_message_is_dropped_with_an_error(
    broker: Broker, timer: Timer, applied: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    with broker.connection.Producer() as producer:
        producer.publish({"not": "a list"}, routing_key=CENTRAL_UPDATES_QUEUE, exchange=broker.queue.exchange,
                         headers={"task": INGEST_SNAPSHOT_UPDATE}, serializer="json")
        producer.publish([[{"n": 1}], {}, {}], routing_key=CENTRAL_UPDATES_QUEUE,
                         exchange=broker.queue.exchange, serializer="json",
                         headers={"task": INGEST_SNAPSHOT_UPDATE, "expires": "next tuesday"})
    batcher = applied.batcher(timer, batching=False)
    messages = broker.take(batcher)
    assert applied.batches == [] and all(acked(messages)) and len(messages) == 2
    assert caplog.text.count("not a task message") == 2


def test_a_database_error_keeps_the_updates_not_done_and_tries_again_after_growing_pauses(
    broker: Broker, timer: Timer, applied: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    batcher = applied.batcher(timer, batch_max=3)
    applied.fail = [OperationalError("database is locked"), OperationalError("still locked")]
    applied.done_first = 1
    for n in range(3):
        broker.send({"n": n})
    messages = broker.take(batcher)

    # The first was done before the error; the other two are held, and tried again in 2 s.
    assert acked(messages) == [True, False, False]
    assert [body for _, body in batcher.held] == [{"n": 1}, {"n": 2}]
    assert timer.pending == [2.0] and batcher.waiting_for_database
    assert "could not apply 2 snapshot updates (OperationalError: database is locked); trying again in 2 s" \
        in caplog.text

    # More arrive meanwhile: held behind them, not applied while the database is away (a full batch too).
    for n in range(3, 5):
        broker.send({"n": n})
    messages += broker.take(batcher)
    assert len(applied.batches) == 1 and len(batcher.held) == 4
    timer.run()  # fails again: the next pause is twice as long
    assert timer.pending == [4.0]
    assert applied.batches[-1] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert acked(messages) == [True, True, False, False, False]  # done_first: {"n": 1} was done

    timer.run()  # the database is back: everything held
    assert applied.batches[-1] == [{"n": 2}, {"n": 3}, {"n": 4}]
    assert all(acked(messages)) and batcher.held == [] and not batcher.waiting_for_database
    assert batcher.failures == 0 and timer.pending == []


def test_an_update_that_expires_while_the_database_is_away_is_dropped(
    broker: Broker, timer: Timer, applied: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    batcher = applied.batcher(timer, batching=False)
    applied.fail = [OperationalError("down")]
    broker.send({"n": 0}, expires=datetime.now(UTC) + timedelta(seconds=30))
    messages = broker.take(batcher)
    assert batcher.held and not any(acked(messages))
    later = datetime.now(UTC) + timedelta(seconds=60)
    clock = type("Later", (datetime,), {"now": staticmethod(lambda tz: later)})
    monkeypatch.setattr(update_batches, "datetime", clock)
    timer.run()
    assert len(applied.batches) == 1  # nothing left to apply
    assert all(acked(messages)) and batcher.held == []


def test_any_other_error_is_logged_and_the_batchs_updates_not_done_are_acknowledged(
    broker: Broker, timer: Timer, applied: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    batcher = applied.batcher(timer, batch_max=2)
    applied.fail = [ValueError("a bug")]
    applied.done_first = 1
    for n in range(2):
        broker.send({"n": n})
    messages = broker.take(batcher)
    assert all(acked(messages)) and batcher.held == [] and timer.pending == []
    assert "applying a batch of 2 snapshot updates failed; the 1 not done are dropped" in caplog.text
    assert "ValueError: a bug" in caplog.text  # with its traceback


def test_a_waiting_update_is_looked_at_each_second_and_given_again_once_its_base_came_or_its_wait_is_over(
    broker: Broker, timer: Timer, applied: Recorded, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=update_batches.__name__)
    clock = [1000.0]
    monkeypatch.setattr(update_batches, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    batcher = applied.batcher(timer, batch_max=3, base_wait_seconds=10)
    applied.no_base = [{"n": 1, "host": "b"}]
    for n in range(3):
        broker.send({"n": n, "host": "aba"[n]})
    messages = broker.take(batcher)  # a full batch: applied at once

    # Kept, unacknowledged and opened, looked at again a second later: its base has not come, so it is
    # not given again.
    assert acked(messages) == [True, False, True]
    assert [body for _, body in batcher.waiting] == [{"n": 1, "host": "b", "opened": True}]
    assert batcher.held == [] and timer.pending == [BASE_RETRY_SECONDS]
    assert "applied a batch of 2 snapshot updates; 1 wait for their base" in caplog.text
    timer.run()
    assert applied.looked == [[{"n": 1, "host": "b"}]] and len(applied.batches) == 1
    assert timer.pending == [BASE_RETRY_SECONDS]

    # A batch comes first: its host's update waits behind it, untried; the other host's is applied.
    clock[0] += 0.5
    broker.send({"n": 3, "host": "b"})
    broker.send({"n": 4, "host": "a"})
    messages += broker.take(batcher)
    timer.run(only=BATCH_WAIT_SECONDS)  # the batch's wait; not yet the waiting one's second
    assert applied.batches[-1] == [{"n": 3, "host": "b"}, {"n": 4, "host": "a"}]
    assert applied.tried[-1] == {"n": 4, "host": "a"}
    assert acked(messages) == [True, False, True, False, True]
    assert [body["n"] for _, body in batcher.waiting] == [1, 3] and timer.pending == [BASE_RETRY_SECONDS]

    # Its second: both looked at in one read; its base has not come, so neither is given again.
    clock[0] += 1
    batches = len(applied.batches)
    timer.run()
    assert applied.looked[-1] == [{"n": 1, "host": "b"}, {"n": 3, "host": "b"}]
    assert len(applied.batches) == batches and timer.pending == [BASE_RETRY_SECONDS]
    assert [body["n"] for _, body in batcher.waiting] == [1, 3]

    # Its base came: given again as opened, oldest first, both are applied.
    applied.no_base = []
    clock[0] += 1
    timer.run()
    assert applied.batches[-1] == [{"n": 1, "host": "b"}, {"n": 3, "host": "b"}]
    assert all(acked(messages)) and batcher.waiting == [] and timer.pending == []

    # Another whose base does not come within the wait: looked at, not given again, until the wait is
    # over; then given once more, and refused (done).
    applied.no_base = [{"n": 5, "host": "c"}]
    broker.send({"n": 5, "host": "c"})
    messages += broker.take(batcher)
    timer.run()  # the batch's wait
    assert not acked(messages)[-1]
    clock[0] += 5
    timer.run()  # looked at after a second: still within the wait
    assert not acked(messages)[-1] and timer.pending == [BASE_RETRY_SECONDS]
    assert applied.batches[-1] == [{"n": 5, "host": "c"}] and len(applied.looked) == 4
    clock[0] += 5
    timer.run()  # ten seconds after it first waited: no longer
    assert all(acked(messages)) and batcher.waiting == [] and timer.pending == []
    assert applied.batches[-2:] == [[{"n": 5, "host": "c"}]] * 2 and len(applied.looked) == 5


def test_an_update_waits_longer_for_its_base_while_central_still_holds_messages(
    broker: Broker, timer: Timer, applied: Recorded, monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(update_batches, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    asked: list[bool] = []
    central_holds = [True]

    def central_queued() -> bool:
        asked.append(central_holds[0])
        return central_holds[0]

    batcher = applied.batcher(timer, base_wait_seconds=10,
                            central_queued=central_queued)
    waiting = [{"n": n, "host": f"gpu{n}"} for n in range(2)]
    applied.no_base = list(waiting)
    for update in waiting:
        broker.send(update)
    messages = broker.take(batcher)
    timer.run()
    assert asked == []  # within a probe interval: the broker is not asked

    clock[0] += 30  # past the interval, within BASE_WAIT_QUEUED_INTERVALS of them
    timer.run()
    assert asked == [True] and not any(acked(messages)) and len(batcher.waiting) == 2  # asked once

    central_holds[0] = False  # central drained: its base is not coming; given again, they are refused
    clock[0] += 1
    timer.run()
    assert asked[:2] == [True, False] and all(acked(messages)) and batcher.waiting == []

    # However long central stays busy, an update waits BASE_WAIT_QUEUED_INTERVALS intervals at most.
    central_holds[0] = True
    broker.send(waiting[0])
    messages = broker.take(batcher)
    timer.run()
    clock[0] += 10 * update_batches.BASE_WAIT_QUEUED_INTERVALS - 1
    timer.run()
    assert not any(acked(messages))
    clock[0] += 1
    timer.run()
    assert all(acked(messages)) and batcher.waiting == []


def test_an_update_waits_on_while_its_host_moves_and_a_probe_interval_after_its_last_move(
    broker: Broker, timer: Timer, applied: Recorded, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The updates before it come in turn, some from another worker (each step a second or more under
    # load): the wait is a probe interval from the last step, not from the first wait.
    clock = [1000.0]
    monkeypatch.setattr(update_batches, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    batcher = applied.batcher(timer, base_wait_seconds=10)
    moving, still = {"n": 5, "host": "moving"}, {"n": 6, "host": "still"}
    applied.no_base = [moving, still]
    broker.send(moving)
    broker.send(still)
    messages = broker.take(batcher)
    timer.run()  # the batch: both wait
    for _ in range(3):  # its host moves every 6 s: 18 s in all
        clock[0] += 6
        applied.moves["moving"] = applied.moves.get("moving", 0) + 1
        timer.run()
    assert acked(messages) == [False, True]  # the other, its host still, was refused after 10 s
    assert [body["host"] for _, body in batcher.waiting] == ["moving"]

    clock[0] += 9  # 9 s since its host last moved: waits on
    timer.run()
    assert not acked(messages)[0]
    clock[0] += 1  # 10 s: given again, refused
    timer.run()
    assert all(acked(messages)) and batcher.waiting == [] and timer.pending == []
    assert applied.batches[-1] == [moving]

    # However often its host moves, an update waits BASE_WAIT_QUEUED_INTERVALS probe intervals at most.
    broker.send(moving)
    messages = broker.take(batcher)
    timer.run()
    for _ in range(10 * update_batches.BASE_WAIT_QUEUED_INTERVALS // 5 - 1):
        clock[0] += 5
        applied.moves["moving"] += 1
        timer.run()
    assert not acked(messages)[0]
    clock[0] += 5
    timer.run()
    assert all(acked(messages)) and batcher.waiting == []

    # What the oldest of a host waits for comes after the one behind it waited ten seconds: given again
    # together, the oldest applies; the next finds the next gap (another worker holds the update between
    # them) and waits on, from then.
    oldest, later = {"n": 7, "host": "h"}, {"n": 9, "host": "h"}
    applied.no_base = [oldest, later]
    broker.send(oldest)
    broker.send(later)
    messages = broker.take(batcher)
    timer.run()  # the batch: the oldest waits, the later behind it
    clock[0] += 12
    applied.no_base = [later]
    timer.run()
    assert applied.batches[-1] == [oldest, later] and acked(messages) == [True, False]
    assert [body for _, body in batcher.waiting] == [{**later, "opened": True}]
    clock[0] += 9
    timer.run()
    assert not acked(messages)[1]
    clock[0] += 1
    timer.run()
    assert all(acked(messages)) and batcher.waiting == []


def test_waiting_updates_whose_bases_came_are_given_again_a_batch_at_a_time_and_the_rest_wait_on(
    broker: Broker, timer: Timer, applied: Recorded
) -> None:
    def update(n: int) -> dict[str, Any]:
        return {"n": n, "host": f"gpu{n}"}

    batcher = applied.batcher(timer, batch_max=2, base_wait_seconds=10)
    applied.no_base = [update(0), update(1), update(2), update(3)]
    for n in range(5):
        broker.send(update(n))
    messages = broker.take(batcher)
    timer.run()
    assert acked(messages) == [False, False, False, False, True]
    assert [body["n"] for _, body in batcher.waiting] == [0, 1, 2, 3]

    broker.send(update(5))
    messages += broker.take(batcher)
    timer.run(only=BATCH_WAIT_SECONDS)  # the new one's batch, without those waiting
    assert applied.batches[-1] == [update(5)] and acked(messages)[-1]
    applied.no_base = [update(1)]
    timer.run()  # their second: those whose bases came given once, a batch at a time
    assert applied.looked[-1] == [update(n) for n in range(4)]
    assert applied.batches[-2:] == [[update(0), update(2)], [update(3)]]
    assert acked(messages) == [True, False, True, True, True, True]
    assert [body["n"] for _, body in batcher.waiting] == [1] and timer.pending == [BASE_RETRY_SECONDS]


def test_updates_waiting_while_the_database_was_away_are_given_again_once_it_is_back(
    broker: Broker, timer: Timer, applied: Recorded
) -> None:
    first, second = {"n": 0, "host": "gpu0"}, {"n": 1, "host": "gpu1"}
    batcher = applied.batcher(timer, base_wait_seconds=10)
    applied.no_base = [first]
    broker.send(first)
    messages = broker.take(batcher)
    timer.run()
    applied.fail = [OperationalError("down")]
    broker.send(second)
    messages += broker.take(batcher)
    timer.run(only=BATCH_WAIT_SECONDS)  # the batch fails
    timer.run(only=BASE_RETRY_SECONDS)  # the waiting one's second: the database is away, nothing done
    assert batcher.waiting_for_database and len(batcher.waiting) == 1 and len(applied.batches) == 2
    applied.no_base = []
    timer.run()  # the retry: the waiting one first, then the one kept
    assert applied.batches[-1] == [first, second]
    assert all(acked(messages)) and batcher.waiting == [] and timer.pending == []


def one_waiting(broker: Broker, timer: Timer, applied: Recorded) -> tuple[UpdateBatcher, list[Message]]:
    """A batcher keeping one update, ``{"n": 0}``, waiting for its base; the messages taken."""
    batcher = applied.batcher(timer, base_wait_seconds=10)
    applied.no_base = [{"n": 0}]
    broker.send({"n": 0})
    messages = broker.take(batcher)
    timer.run(only=BATCH_WAIT_SECONDS)  # it waits for its base
    assert len(batcher.waiting) == 1
    return batcher, messages


def test_when_the_read_of_what_they_wait_for_fails_those_waiting_are_given_again(
    broker: Broker, timer: Timer, applied: Recorded
) -> None:
    batcher, messages = one_waiting(broker, timer, applied)

    def database_away(waiting: list[Any]) -> list[Any]:
        raise OperationalError("down")

    batcher.read_progress = database_away
    applied.no_base = []
    timer.run()  # given again: the batch is the database's judge (and its retry, had it failed)
    assert applied.batches[-1] == [{"n": 0}] and all(acked(messages)) and batcher.waiting == []


def test_stopping_leaves_the_updates_waiting_for_their_base_unacknowledged(
    broker: Broker, timer: Timer, applied: Recorded
) -> None:
    batcher, messages = one_waiting(broker, timer, applied)
    batcher.close()  # looked at once more, still waiting: left for the broker to give back
    assert not any(acked(messages)) and batcher.waiting == [] and timer.pending == []
    assert applied.looked == [[{"n": 0}]] and len(applied.batches) == 1


class BrokerGone(ConnectionError):
    pass


def test_an_acknowledgement_the_broker_refuses_is_let_out_for_the_worker_to_reconnect(
    broker: Broker, timer: Timer
) -> None:
    def ack_fails(messages: list[Any], **_: Any) -> None:
        raise BrokerGone("connection reset")

    batcher = UpdateBatcher(schedule=timer, batch_max=2, apply=ack_fails, broker_errors=(BrokerGone,))
    broker.send({"n": 0})
    broker.send({"n": 1})
    with pytest.raises(BrokerGone):
        broker.take(batcher)
    assert batcher.held == [] and timer.pending == []


def test_stopping_applies_what_is_held_unless_the_database_is_away(
    broker: Broker, timer: Timer, applied: Recorded
) -> None:
    batcher = applied.batcher(timer)
    broker.send({"n": 0})
    messages = broker.take(batcher)
    batcher.close()
    assert applied.batches == [[{"n": 0}]] and all(acked(messages)) and timer.pending == []

    batcher = applied.batcher(timer, batching=False)
    applied.fail = [OperationalError("down")]
    broker.send({"n": 1})
    messages = broker.take(batcher)
    batcher.close()  # no new attempt: left unacknowledged, for the broker to give back
    assert len(applied.batches) == 2 and not any(acked(messages))
    assert batcher.held == [] and timer.pending == []


def test_the_pauses_grow_as_the_ingest_tasks_do() -> None:
    assert [retry_pause_seconds(n) for n in range(1, 11)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


@pytest.mark.parametrize(("consume_from", "default_queue", "expected"), [
    (None, CENTRAL_QUEUE, True),  # no -Q: the default queue, central
    ({CENTRAL_QUEUE: None}, CENTRAL_QUEUE, True),  # -Q central
    ({CENTRAL_QUEUE: None, "host.gpu01": None}, CENTRAL_QUEUE, True),  # make run's worker
    ({"host.gpu01": None}, CENTRAL_QUEUE, False),  # an agent
    (None, "elsewhere", False),
])
def test_only_workers_that_consume_central_take_snapshot_updates(
    consume_from: dict[str, None] | None, default_queue: str, expected: bool
) -> None:
    assert consumes_central(consume_from, default_queue) is expected


def test_the_consumer_step_is_one_of_every_workers_consumer_steps() -> None:
    assert UpdateBatchConsumer in app.steps["consumer"]
    assert "gpuadmin.fleet.update_batches" in app.conf.include


class LoopTimer(Timer):
    """The event loop's timer as the consumer step uses it: ``call_after(seconds, function, args)``."""

    def call_after(self, seconds: float, function: Callable[..., None], args: tuple[Any, ...] = ()) -> Entry:
        return self(seconds, lambda: function(*args))


@pytest.mark.services
def test_on_redis_the_step_takes_updates_many_at_a_time_and_gives_back_those_waiting_when_it_stops(
    redis_server: RedisServer, applied: Recorded, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.delete(CENTRAL_UPDATES_QUEUE, CENTRAL_QUEUE, "unacked", "unacked_index")
    monkeypatch.setattr(update_batches, "receive_snapshot_updates", applied)
    monkeypatch.setattr(update_batches, "waited_on", applied.read_progress)
    caplog.set_level(logging.INFO, logger=update_batches.__name__)
    applied.no_base = [{"n": 1}]
    with Connection(redis_server.url) as connection:
        for n in range(5):
            app.send_task(INGEST_SNAPSHOT_UPDATE, args=[{"n": n}], queue=CENTRAL_UPDATES_QUEUE,
                          connection=connection)
        timer = LoopTimer()
        worker = SimpleNamespace(connection=connection, hub=object(), timer=timer, app=app)
        step = UpdateBatchConsumer(worker)
        step.start(worker)  # takes what is queued at once, in one call
        assert client.llen(CENTRAL_UPDATES_QUEUE) == 0 and client.hlen("unacked") == 5
        assert "in batches of up to 200 (200 at a time off Redis)" in caplog.text

        timer.run()  # the batch's wait is over: applied; the acknowledgements sent together after it
        assert applied.batches == [[{"n": n} for n in range(5)]]
        assert client.hlen("unacked") == 1  # the one waiting for its base
        assert sorted(timer.pending) == [BATCH_WAIT_SECONDS, BASE_RETRY_SECONDS]  # the next take; the retry

        assert step.batcher is not None and step.batcher.central_queued is not None
        assert not step.batcher.central_queued()  # an update's base may come while central holds messages
        app.send_task(INGEST_SNAPSHOT, args=[{}], queue=CENTRAL_QUEUE, connection=connection)
        assert step.batcher.central_queued()
        client.delete(CENTRAL_QUEUE)

        step.stop(worker)  # looked at once more, still waiting: back at the head of the queue
        assert applied.looked[-1] == [{"n": 1}] and len(applied.batches) == 1 and timer.pending == []
        assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0
        [back] = client.lrange(CENTRAL_UPDATES_QUEUE, 0, -1)
        assert json.loads(base64.b64decode(json.loads(back)["body"]))[0] == [{"n": 1}]


@pytest.mark.services
def test_on_redis_updates_waiting_for_their_base_are_bounded_and_the_rest_stay_in_the_broker(
    redis_server: RedisServer, applied: Recorded, monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.delete(CENTRAL_UPDATES_QUEUE, CENTRAL_QUEUE, "unacked", "unacked_index")
    monkeypatch.setattr(update_batches, "receive_snapshot_updates", applied)
    monkeypatch.setattr(update_batches, "waited_on", applied.read_progress)
    monkeypatch.setattr(update_batches, "WAITING_MAX", 2)
    updates = [{"n": n, "host": f"gpu{n}"} for n in range(5)]
    applied.no_base = list(updates)
    with Connection(redis_server.url) as connection:
        for update in updates:
            app.send_task(INGEST_SNAPSHOT_UPDATE, args=[update], queue=CENTRAL_UPDATES_QUEUE,
                          connection=connection)
        timer = LoopTimer()
        worker = SimpleNamespace(connection=connection, hub=object(), timer=timer, app=app)
        step = UpdateBatchConsumer(worker)
        step.start(worker)  # room for two that may wait
        timer.run(only=BATCH_WAIT_SECONDS)  # they wait; the next take finds no room
        assert step.batcher is not None and len(step.batcher.waiting) == 2
        assert client.llen(CENTRAL_UPDATES_QUEUE) == 3 and client.hlen("unacked") == 2

        applied.no_base = []  # their bases came: given again, applied; the rest taken (two at most a take)
        timer.run(only=BASE_RETRY_SECONDS)
        for _ in range(4):
            timer.run(only=BATCH_WAIT_SECONDS)
        assert sorted(m["n"] for batch in applied.batches for m in batch if m not in updates[:2]) == [2, 3, 4]
        assert client.llen(CENTRAL_UPDATES_QUEUE) == 0 and client.hlen("unacked") == 0
        step.stop(worker)


# Committed, as in a worker: the batcher closes connections by Django's rule between batches.
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_signed_updates_are_applied_together_by_central_and_acknowledged_once_committed(
    broker: Broker, timer: Timer, tmp_path: Path
) -> None:
    taken_at = datetime.now(UTC) - timedelta(minutes=1)
    names = ["gpu-batch-a", "gpu-batch-b", "gpu-batch-c"]
    for name in names:
        for message in stored_with_updates(name, tmp_path / f"{name}.json", taken_at=taken_at):
            broker.send(message)
    calls: list[int] = []

    def counted(messages: list[Any], **options: Any) -> None:
        calls.append(len(messages))
        receive_snapshot_updates(messages, **options)

    batcher = UpdateBatcher(schedule=timer, apply=counted)
    messages = broker.take(batcher)
    timer.run()
    assert calls == [3] and all(acked(messages))
    latest = LatestSnapshot.objects.filter(host__name__in=names)
    assert sorted(latest.values_list("update_sequence", flat=True)) == [1, 1, 1]
