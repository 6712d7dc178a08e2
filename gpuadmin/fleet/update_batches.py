"""Snapshot updates taken from the broker in batches: central's consumer of ``central.updates``.

At fleet scale nearly every message is a snapshot update (one per host every probe interval), and a
Celery task per message costs the worker's main process more than applying it (a Request object,
the pool's round trip, tracing). ``UpdateBatchConsumer``, a consumer bootstep, takes them from their
own queue (``CENTRAL_UPDATES_QUEUE``) and applies them through
``intake.updates.receive_snapshot_updates``, many in one call, in the worker's main process. On Redis
it takes up to a batch at a time, every ``BATCH_WAIT_SECONDS`` or at once after a full one
(``gpuadmin.broker.redis_taking.RedisTaker``: a message at a time through kombu's consumer cost more
than the rest of its way); elsewhere (the embedded broker, a key prefix) through a kombu consumer.

It runs in every worker that consumes ``central`` (``-Q central``, ``make run``'s
``-Q central,host.<name>``), never in an agent-only worker (``-Q host.<name>``). The messages stay
Celery's (task protocol 2: the same sender, ``gpuadmin.sending.send_snapshot_update``); each is
acknowledged once its outcome is committed, applied or refused, so a worker that dies gives the rest
back to the broker. What ``UpdateBatcher`` does with each message:

- another task's message does not belong here: logged and acknowledged, never run;
- one past its ``expires`` is dropped, as Celery drops an expired task (also one that expires while
  it waits for the database);
- the rest are held and applied together once ``BATCH_MAX`` are held or ``BATCH_WAIT_SECONDS`` after
  the first, on the worker's event loop. A worker without one (the embedded filesystem broker has
  none: ``make run``) applies each as it comes;
- an update whose base (its full snapshot, in ``central``, taken by the pool) is not stored yet waits
  for it, and one after a gap for the updates before it (another central worker may hold them): kept
  unacknowledged (its signature checked once: kept opened), looked at again every
  ``BASE_RETRY_SECONDS`` (one read for all waiting: ``intake.updates.waited_on``) and given again
  once what it waits for came, for up to one probe interval since it began to wait or its host last
  moved (the updates before it come in turn, from several workers: each restarts the wait), or
  ``BASE_WAIT_QUEUED_INTERVALS`` of them while ``central`` still holds messages (a backlog
  draining: its base may be among them), never longer; then it is refused, and the host asked for a
  full snapshot. Its host's later updates wait behind it, untried. A backlog drains the two queues at
  their own pace: without the wait, most hosts whose full snapshot was queued behind others had the
  next update refused; given again with every batch, or every second, each was locked and checked
  again and again;
- a ``DatabaseError`` keeps those not done in hand and tries again after growing pauses (the ingest
  tasks' backoff); any other error is logged and the batch's messages not done are acknowledged, as a
  failed task's would be.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from celery import bootsteps
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from kombu import Consumer
from kombu.message import Message

from gpuadmin.broker.redis_taking import RedisTaker, TakenMessage
from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, app
from gpuadmin.fleet.intake.updates import HostProgress, OpenedUpdate, receive_snapshot_updates, waited_on
from gpuadmin.fleet.tasks import INGEST_RETRY_BACKOFF_MAX_SECONDS, INGEST_RETRY_BACKOFF_SECONDS
from gpuadmin.wire.task_names import INGEST_SNAPSHOT_UPDATE

logger = logging.getLogger(__name__)

BATCH_MAX = 200
# An update waits up to this long for others to share its batch's fixed costs (a transaction, a dozen
# statements, the hosts' locks), which a fleet of a thousand hosts otherwise spreads over a handful of
# updates (benchmarks/README.md). Pages poll every few seconds and hosts probe every
# GPUADMIN_PROBE_INTERVAL: neither sees the wait.
BATCH_WAIT_SECONDS = 0.5
# Messages the broker may hand this consumer before it acknowledges any: a batch being applied and
# the next one filling meanwhile.
PREFETCH_BATCHES = 2
FLUSH_LOG = "applied a batch of %d snapshot updates"
# How often updates waiting for their base are looked at again.
BASE_RETRY_SECONDS = 1.0
# How long an update may wait for its base while `central` still holds messages, in probe intervals;
# and at most, however its host moves meanwhile.
BASE_WAIT_QUEUED_INTERVALS = 6
# Updates waiting for their base that a consumer taking off Redis keeps at most, beside the prefetch's.
# While it keeps this many it takes no more: the full snapshots, taken one at a time from `central`,
# are behind the updates, and the worker's turns go to them. Most updates of a backlog apply on an
# older base, so the updates' queue would otherwise run ever further ahead of the full snapshots',
# until the waits ran out and the updates that waited were refused.
WAITING_MAX = 2 * BATCH_MAX


class Cancellable(Protocol):
    def cancel(self) -> None: ...


# schedule(seconds, function): call function once, later, in the consumer's own thread.
Schedule = Callable[[float, Callable[[], None]], Cancellable]
Apply = Callable[..., None]  # receive_snapshot_updates(messages, *, done, wait, behind)
ReadProgress = Callable[[list[OpenedUpdate]], list[HostProgress | None]]  # intake.updates.waited_on


# A host whose progress was not looked at yet: nothing to compare with, never seen to move.
_NOT_SEEN: tuple[HostProgress | None, float] = (None, -math.inf)


def retry_pause_seconds(failures: int) -> float:
    """The pause after ``failures`` DatabaseErrors in a row (1: the first), as the ingest tasks wait."""
    return float(get_exponential_backoff_interval(
        factor=INGEST_RETRY_BACKOFF_SECONDS, retries=failures - 1, maximum=INGEST_RETRY_BACKOFF_MAX_SECONDS,
        full_jitter=False))


def expired(message: Message, *, now: datetime | None = None) -> bool:
    """Whether the message's ``expires`` (ISO 8601, as Celery writes it) is past; ValueError or TypeError
    when it is not a moment."""
    expires = message.headers.get("expires")
    if not expires:
        return False
    # Celery writes datetime.isoformat() (a message's headers are JSON: always text), which the standard
    # library reads back: no need of Celery's maybe_iso8601 and its general ISO 8601 parser.
    moment = datetime.fromisoformat(expires)
    if moment.tzinfo is None:  # Celery writes UTC
        moment = moment.replace(tzinfo=UTC)
    return moment <= (now or datetime.now(UTC))


class UpdateBatcher:
    """What the consumer does with each message from ``central.updates``, without Celery's worker.

    ``schedule`` runs a function later in the consumer's thread (the event loop's timer); ``batching``
    False applies each message as it comes (no event loop); ``broker_errors`` are let out (an ack
    that failed: the worker reconnects, the broker gives back what was not acknowledged).
    """

    def __init__(self, *, schedule: Schedule, batching: bool = True, batch_max: int = BATCH_MAX,
                 wait_seconds: float = BATCH_WAIT_SECONDS, apply: Apply | None = None,
                 broker_errors: tuple[type[BaseException], ...] = (),
                 base_wait_seconds: float | None = None, central_queued: Callable[[], bool] | None = None,
                 read_progress: ReadProgress | None = None) -> None:
        self.schedule, self.batching = schedule, batching
        self.apply = receive_snapshot_updates if apply is None else apply
        self.read_progress = waited_on if read_progress is None else read_progress
        self.batch_max, self.wait_seconds, self.broker_errors = batch_max, wait_seconds, broker_errors
        self.base_wait_seconds = (float(settings.GPUADMIN_PROBE_INTERVAL_SECONDS) if base_wait_seconds is None
                                  else base_wait_seconds)
        self.central_queued = central_queued  # whether `central` holds messages (None: not known)
        self.held: list[tuple[Message, Any]] = []  # (message, its signed body), in the order received
        self.waiting: list[tuple[Message, OpenedUpdate]] = []  # waiting for their base, oldest first
        # By delivery tag (kombu's stubs allow None): when each began to wait, on the monotonic clock;
        # kept for those still held, forgotten after each batch for the rest.
        self._waiting_since: dict[Any, float] = {}
        # By host of updates waiting: its progress when last looked at (None: not looked at yet, or what
        # its oldest waited for came: neither a move to compare with), and when (monotonic) it was last
        # seen to move; forgotten with its last waiting update.
        self._host_progress: dict[str, tuple[HostProgress | None, float]] = {}
        self.failures = 0  # DatabaseErrors in a row
        self._flush_timer: Cancellable | None = None
        self._retry_timer: Cancellable | None = None
        self._base_timer: Cancellable | None = None

    @property
    def waiting_for_database(self) -> bool:
        return self._retry_timer is not None

    def on_message(self, message: Message) -> None:
        name = message.headers.get("task")
        if name != INGEST_SNAPSHOT_UPDATE:
            logger.warning("dropped a message for task %r from %s: only snapshot updates belong there",
                           str(name)[:200], CENTRAL_UPDATES_QUEUE)
            message.ack()
            return
        try:
            is_expired = expired(message)
            signed = None if is_expired else message.decode()[0][0]
        except Exception as error:  # not task protocol 2's [args, kwargs, embed] with the message first
            logger.error("dropped a snapshot update that is not a task message: %s", str(error)[:200])
            message.ack()
            return
        if is_expired:
            logger.info("dropped an expired snapshot update (expired at %s)", message.headers["expires"])
            message.ack()
            return
        self.held.append((message, signed))
        if self.waiting_for_database:
            return
        if not self.batching or len(self.held) >= self.batch_max:
            self.flush()
        elif self._flush_timer is None:
            self._flush_timer = self.schedule(self.wait_seconds, self._flush_due)

    def _flush_due(self) -> None:
        self._flush_timer = None
        if not self.waiting_for_database:
            self.flush()

    def _retry_due(self) -> None:
        self._retry_timer = None
        self.offer_waiting()  # their timer did nothing while the database was away

    def _base_due(self) -> None:
        self._base_timer = None
        if not self.waiting_for_database:
            self.offer_waiting()

    def offer_waiting(self) -> None:
        """Give again, first, the waiting updates of hosts whose wait can end (what the oldest waits for
        came, or it may wait no longer), then what is held. The rest wait on, not offered: at a
        backlog's size, offering every one each second cost more than the updates applied."""
        waiting = self.waiting
        waiting_on = self._still_waiting_hosts(waiting)  # an error raised there loses none of them
        self.waiting = [item for item in waiting if item[1].update.host in waiting_on]
        self.held[:0] = [item for item in waiting if item[1].update.host not in waiting_on]
        self.flush()
        self._look_again_later()

    def _look_again_later(self) -> None:
        if self.waiting and self._base_timer is None:
            self._base_timer = self.schedule(BASE_RETRY_SECONDS, self._base_due)

    def _still_waiting_hosts(self, waiting: list[tuple[Message, OpenedUpdate]]) -> set[str]:
        """The hosts whose oldest waiting update waits on: what it waits for is still to come
        (``waited_on``, one read for all) and it may wait longer. A host's later ones go with it."""
        if not waiting or self.waiting_for_database:
            return set()
        close_old_connections()
        try:
            progress = self.read_progress([opened for _, opened in waiting])
        except DatabaseError:
            return set()  # all offered: the batch meets the error, and waits for the database as it does
        finally:
            close_old_connections()
        now = time.monotonic()
        queued: list[bool] = []
        waits: dict[str, bool] = {}  # by host: whether its oldest waits on
        for (message, opened), now_progress in zip(waiting, progress, strict=True):
            host = opened.update.host
            if host in waits:
                continue
            seen, moved = self._host_progress.get(host, _NOT_SEEN)
            if now_progress is None or (seen is not None and seen != now_progress):
                moved = now  # what its oldest waits for came, or came in part: its host moved
            self._host_progress[host] = (now_progress, moved)
            waits[host] = now_progress is not None and self._may_wait(message.delivery_tag, host, now, queued)
        return {host for host, waits_on in waits.items() if waits_on}

    def flush(self) -> None:
        """Apply what is held, ``batch_max`` at a time, until nothing is held or the database fails.
        Those waiting for their base stay so, and their hosts' updates join them untried."""
        self._cancel_flush_timer()
        while self.held and not self.waiting_for_database:
            self._flush_one_batch()

    def _flush_one_batch(self) -> None:
        batch = self.held[:self.batch_max]
        fresh = [(message, signed) for message, signed in batch if not self._drop_if_expired(message)]
        if not fresh:
            del self.held[:len(batch)]
            return
        done = [False] * len(fresh)
        waited: dict[int, OpenedUpdate] = {}
        now = time.monotonic()

        def mark_done(index: int) -> None:
            fresh[index][0].ack()
            done[index] = True

        queued: list[bool] = []  # whether `central` holds messages: asked at most once a batch

        def may_wait(index: int, opened: OpenedUpdate) -> bool:
            if not self._may_wait(fresh[index][0].delivery_tag, opened.update.host, now, queued):
                return False
            waited[index] = opened
            return True

        close_old_connections()  # Django's rule for a connection kept between tasks (CONN_MAX_AGE)
        try:
            self.apply([signed for _, signed in fresh], done=mark_done, wait=may_wait,
                       behind={opened.update.host for _, opened in self.waiting})
        except self.broker_errors:
            # An ack failed: this channel's messages are the broker's again (restored when the channel
            # closes, or after the visibility timeout); those applied will be refused as replays.
            self.held.clear()
            raise
        except DatabaseError as error:
            self.failures += 1
            pause = retry_pause_seconds(self.failures)
            self.held[:len(batch)] = [item for item, is_done in zip(fresh, done, strict=True) if not is_done]
            logger.warning("could not apply %d snapshot updates (%s: %s); trying again in %.0f s",
                           len(self.held), type(error).__name__, error, pause)
            self._retry_timer = self.schedule(pause, self._retry_due)
            return
        except Exception:
            logger.exception("applying a batch of %d snapshot updates failed; the %d not done are dropped",
                             len(fresh), done.count(False))
            for (message, _), is_done in zip(fresh, done, strict=True):
                if not is_done:
                    message.ack()
            waited.clear()
        finally:
            close_old_connections()
        del self.held[:len(batch)]
        self.failures = 0
        self.waiting += [(fresh[index][0], waited[index]) for index in sorted(waited)]
        if self._waiting_since:  # forget those no longer held: done, dropped, or waited long enough
            kept = {message.delivery_tag for message, _ in (*self.waiting, *self.held)}
            self._waiting_since = {tag: t for tag, t in self._waiting_since.items() if tag in kept}
        if self._host_progress:
            hosts = {opened.update.host for _, opened in self.waiting}
            self._host_progress = {host: seen for host, seen in self._host_progress.items() if host in hosts}
        self._look_again_later()
        if waited:
            logger.info(FLUSH_LOG + "; %d wait for their base", len(fresh) - len(waited), len(waited))
        else:
            logger.info(FLUSH_LOG, len(fresh))

    def _may_wait(self, tag: Any, host: str, now: float, queued: list[bool]) -> bool:
        """Whether the update of delivery tag ``tag`` may wait for its base (again): for a probe interval
        from its first wait or its host's last move, whichever is later, longer while ``central`` holds
        messages (asked once: ``queued``); never ``BASE_WAIT_QUEUED_INTERVALS`` from its first wait."""
        since = self._waiting_since.setdefault(tag, now)
        if now - since >= BASE_WAIT_QUEUED_INTERVALS * self.base_wait_seconds:
            return False
        moved = self._host_progress.get(host, _NOT_SEEN)[1]
        if now - max(since, moved) < self.base_wait_seconds:
            return True
        if not queued:
            queued.append(self.central_queued is not None and self.central_queued())
        return queued[0]

    def _drop_if_expired(self, message: Message) -> bool:
        if expired(message):
            logger.info("dropped a snapshot update that expired while held (expired at %s)",
                        message.headers.get("expires"))
            message.ack()
            return True
        return False

    def _cancel_flush_timer(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def close(self) -> None:
        """The worker stops or reconnects: apply what is held if the database lets us; what is left stays
        unacknowledged, for the broker to give back once the channel closes."""
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
            self.held.clear()
        try:
            self.offer_waiting()
        finally:
            for timer in (self._retry_timer, self._base_timer):
                if timer is not None:
                    timer.cancel()
            self._retry_timer = self._base_timer = None
            self._cancel_flush_timer()
            self.held.clear()
            self.waiting.clear()  # unacknowledged: the broker gives them back
            self._waiting_since.clear()
            self._host_progress.clear()


def consumes_central(consume_from: dict[str, Any] | None, default_queue: str) -> bool:
    """Whether a worker consumes ``central`` (``-Q`` unset: the default queue, `central` in settings)."""
    if consume_from is None:
        return default_queue == CENTRAL_QUEUE
    return CENTRAL_QUEUE in consume_from


class _InLoop:
    """A timer entry whose function is handed to the consumer's loop (``c.call_soon``) when it fires: a
    worker without an event loop has only a timer thread, and nothing may run there."""

    def __init__(self, c: Any, seconds: float, function: Callable[[], None]) -> None:
        self.cancelled = False
        self.entry = c.timer.call_after(seconds, c.call_soon, (self._run,))
        self.function = function

    def _run(self) -> None:
        if not self.cancelled:
            self.function()

    def cancel(self) -> None:
        self.cancelled = True
        self.entry.cancel()


class UpdateBatchConsumer(bootsteps.ConsumerStep):
    """Consume ``central.updates`` in a worker that consumes ``central``, with a channel and prefetch of
    its own (the task consumer's stays one message: ``CELERY_WORKER_PREFETCH_MULTIPLIER``)."""

    label = "snapshot update batches"

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.batcher: UpdateBatcher | None = None
        self.taker: RedisTaker | None = None
        self._take_entry: Any = None
        super().__init__(c, **kwargs)

    def include_if(self, c: Any) -> bool:
        return consumes_central(c.app.amqp.queues.consume_from, c.app.conf.task_default_queue)

    def start(self, c: Any) -> None:
        connection = c.connection
        channel = connection.channel()
        queue = c.app.amqp.queues[CENTRAL_UPDATES_QUEUE]
        taking = c.hub is not None and RedisTaker.serves(channel)
        taker = self.taker = RedisTaker(channel, queue.name) if taking else None
        self.batcher = UpdateBatcher(
            schedule=self._scheduler(c, then=taker.send_acks if taker else None), batching=c.hub is not None,
            broker_errors=tuple(connection.connection_errors) + tuple(connection.channel_errors),
            central_queued=lambda: bool(channel.queue_declare(queue=CENTRAL_QUEUE).message_count))
        if taker is not None:
            queue(channel).declare()  # kombu's restore finds the queue by its binding
            self._take(c)
            how = f"{BATCH_MAX} at a time off Redis"
        else:
            self.consumers = [Consumer(channel, queues=[queue], on_message=self.batcher.on_message,
                                       accept=["json"], prefetch_count=PREFETCH_BATCHES * BATCH_MAX)]
            for consumer in self.consumers:
                consumer.consume()
            how = "one by one: no event loop" if c.hub is None else "through kombu's consumer"
        logger.info("taking snapshot updates from %s in batches of up to %d (%s)", CENTRAL_UPDATES_QUEUE,
                    BATCH_MAX, how)

    def _take(self, c: Any) -> None:
        """Take what the broker holds, up to a batch and the prefetch's bound on messages in hand (those
        waiting for their base bound apart, ``WAITING_MAX``); again at once after a full batch, else
        after the batches' wait. Not while the database is away: what is queued stays in the broker."""
        self._take_entry = None
        batcher, taker = self.batcher, self.taker
        if batcher is None or taker is None:
            return
        taken: list[TakenMessage] = []
        try:
            waiting = len(batcher.waiting)
            room = min(BATCH_MAX, PREFETCH_BATCHES * BATCH_MAX - (len(taker.held) - waiting),
                       WAITING_MAX - waiting)
            if room > 0 and not batcher.waiting_for_database:
                taken = taker.take(room)
            for message in taken:
                batcher.on_message(message)
            taker.send_acks()
        finally:  # an error is the event loop's to log, or Celery's reconnect (which calls stop)
            if self.taker is taker:
                self._take_entry = c.timer.call_after(0 if len(taken) == BATCH_MAX else BATCH_WAIT_SECONDS,
                                                      self._take, (c,))

    @staticmethod
    def _scheduler(c: Any, *, then: Callable[[], None] | None = None) -> Schedule:
        if c.hub is not None:
            # The event loop's own timer: what it runs runs in the loop, and a broker error raised
            # there reaches Celery's reconnect (see StalledConsumerGuard in gpuadmin/celery.py).
            if then is None:
                return c.timer.call_after
            after = then

            def schedule(seconds: float, function: Callable[[], None]) -> Cancellable:
                def run() -> None:
                    function()
                    after()
                return cast(Cancellable, c.timer.call_after(seconds, run))
            return schedule
        return lambda seconds, function: _InLoop(c, seconds, function)

    def stop(self, c: Any) -> None:
        self._close_batcher()
        super().stop(c)

    def shutdown(self, c: Any) -> None:
        self._close_batcher()
        super().shutdown(c)

    def _close_batcher(self) -> None:
        batcher, self.batcher = self.batcher, None
        taker, self.taker = self.taker, None
        if self._take_entry is not None:
            self._take_entry.cancel()
            self._take_entry = None
        if batcher is None:
            return
        held = len(batcher.held) + len(batcher.waiting)
        try:
            batcher.close()
            if taker is not None:
                taker.give_back()
        except Exception as error:  # stopping: what is left goes back to the broker unacknowledged
            logger.warning("stopped with up to %d snapshot updates not acknowledged (%s: %s)", held,
                           type(error).__name__, error)
        finally:
            if taker is not None:  # kombu's consumers' channels are closed by ConsumerStep; this one here
                with contextlib.suppress(Exception):
                    taker.channel.close()


app.steps["consumer"].add(UpdateBatchConsumer)

