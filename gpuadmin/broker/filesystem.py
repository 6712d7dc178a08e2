"""The embedded broker: kombu's filesystem transport, made safe for a box that runs for days.

Celery selects it with ``broker_transport = "gpuadmin.broker.filesystem:Transport"``
and one transport option, ``data_folder`` (the broker's root, 0700). Under it:

- ``queue/``: messages ready for delivery, one file each, named
  ``<ns since the epoch, 20 digits>_<uuid>.<queue>.msg`` (kombu's scheme,
  zero-padded so that names sort in the order they were sent);
- ``incoming/``: a message being written. It is renamed into ``queue/`` only
  when complete, so a consumer never sees a file that is half written (kombu's
  own ``_put`` creates the file in place and writes it afterwards: celery/kombu#1551);
- ``claimed/<consumer>/``: messages a consumer took and has not acknowledged
  yet. Taking one is a single rename, so exactly one consumer wins it. The
  consumer holds an flock on ``claimed/<consumer>/.lock`` for its whole life;
  a folder whose lock is free belongs to a consumer that died, and the next
  consumer puts its messages back into ``queue/`` (kombu moves them into the
  system temp dir instead and loses them if the worker dies);
- ``bad/``: files that are not a readable message, set aside with an error in
  the log instead of raising into the worker;
- ``control/``: exchange bindings, rewritten whole under a lock and renamed
  into place, so a reader never sees a table half written.

Nothing is fsync'ed: a process crash loses nothing (the page cache survives),
a power cut may lose the messages of the last seconds (a file left empty is
then set aside as bad, never fatal). See docs/broker.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.exceptions import ConnectionError as BrokerConnectionError
from kombu.transport import filesystem, virtual
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

logger = logging.getLogger(__name__)

TRANSPORT_PATH = "gpuadmin.broker.filesystem:Transport"
FOLDER_MODE = 0o700
FILE_MODE = 0o600
MESSAGE_SUFFIX = ".msg"
LOCK_NAME = ".lock"
STAGING_PREFIX = ".new-"
# How often a consumer looks for messages left claimed by a consumer that died.
RECOVER_EVERY_SECONDS = 10.0
# Time between empty polls: bounds the delay of a message sent to an idle worker.
DEFAULT_POLLING_INTERVAL_SECONDS = 0.1
# A listing of queue/ takes time in proportion to its backlog. The next one waits at least this
# many times as long as the last took, so that listing stays a small share of a consumer's time
# however long the backlog grows.
LISTING_SPACING_FACTOR = 20


@dataclass(frozen=True)
class BrokerFolders:
    """Where everything of one embedded broker lives; the one place that knows the layout."""

    root: Path

    @classmethod
    def from_options(cls, transport_options: dict[str, Any]) -> BrokerFolders:
        try:
            return cls(Path(transport_options["data_folder"]))
        except KeyError:
            raise ChannelError(f"{TRANSPORT_PATH} needs the transport option 'data_folder'") from None

    @property
    def queue(self) -> Path:
        return self.root / "queue"

    @property
    def incoming(self) -> Path:
        return self.root / "incoming"

    @property
    def claimed(self) -> Path:
        return self.root / "claimed"

    @property
    def bad(self) -> Path:
        return self.root / "bad"

    @property
    def control(self) -> Path:
        return self.root / "control"

    def create(self) -> None:
        """Make every folder, private to this user (messages carry every user's command lines)."""
        self.root.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        self.root.chmod(FOLDER_MODE)  # a root made by an older version may be 0755
        for folder in (self.queue, self.incoming, self.claimed, self.bad, self.control):
            folder.mkdir(mode=FOLDER_MODE, exist_ok=True)


def message_file_name(queue: str) -> str:
    if os.sep in queue or queue.startswith("."):
        raise ChannelError(f"queue name {queue!r} cannot be a file name")
    return f"{time.time_ns():020d}_{uuid.uuid4().hex}.{queue}{MESSAGE_SUFFIX}"


def queue_of(file_name: str) -> str | None:
    """The queue a message file belongs to, or None for anything else in the folder."""
    stamp, dot, rest = file_name.partition(".")
    if not dot or not stamp or not rest.endswith(MESSAGE_SUFFIX):
        return None
    return rest[: -len(MESSAGE_SUFFIX)]


def write_atomically(staging_folder: Path, path: Path, data: bytes) -> None:
    """Write `data` under a temporary name in `staging_folder`, then rename it to `path`.

    Both folders are on one file system, so the rename is atomic: a reader
    sees either no file or all of it.
    """
    staging = staging_folder / f"{uuid.uuid4().hex}.tmp"
    try:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise


class ClaimFolder:
    """``claimed/<pid>-<random>/``: one consumer's unacknowledged messages, with its life lock."""

    def __init__(self, claimed_root: Path) -> None:
        self.pid = os.getpid()
        self.name = f"{self.pid}-{uuid.uuid4().hex[:8]}"
        # Built under a staging name and renamed once locked: a folder visible
        # under its real name always has a held lock while its owner lives.
        staging = claimed_root / f"{STAGING_PREFIX}{self.name}"
        staging.mkdir(mode=FOLDER_MODE)
        self._lock_fd = os.open(staging / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self.path = claimed_root / self.name
        os.rename(staging, self.path)

    def release(self) -> None:
        """Drop the folder once every message in it was acknowledged or put back."""
        if self._lock_fd < 0:
            return
        with contextlib.suppress(OSError):
            if not any(name.endswith(MESSAGE_SUFFIX) for name in os.listdir(self.path)):
                os.unlink(self.path / LOCK_NAME)
                os.rmdir(self.path)
        os.close(self._lock_fd)
        self._lock_fd = -1


def recover_abandoned_claims(folders: BrokerFolders) -> int:
    """Put the messages of consumers that died before acknowledging them back into the queue."""
    recovered = 0
    try:
        entries = [e for e in os.scandir(folders.claimed) if e.is_dir() and not e.name.startswith(".")]
    except FileNotFoundError:
        return 0
    for entry in entries:
        folder = Path(entry.path)
        try:
            lock_fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            lock_fd = -1  # its owner was releasing it, or it was damaged: nobody holds it
        except OSError:
            continue
        try:
            if lock_fd >= 0:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its consumer is alive
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue  # another consumer recovered it first
            for name in names:
                if name.endswith(MESSAGE_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        # The original name: the message goes back to its place in the order.
                        os.rename(folder / name, folders.queue / name)
                        recovered += 1
            with contextlib.suppress(OSError):
                os.unlink(folder / LOCK_NAME)
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)
    if recovered:
        logger.warning("broker: put %d message(s) back in the queue that a stopped consumer had taken "
                       "without acknowledging them", recovered)
    return recovered


class QoS(virtual.QoS):
    """Acknowledging a message deletes its claimed file; rejecting without requeue does too."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        super().ack(delivery_tag)
        self.channel.forget_claim(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        # With requeue the channel's _restore renames the claimed file back first.
        super().reject(delivery_tag, requeue=requeue)
        self.channel.forget_claim(delivery_tag)


class Channel(filesystem.Channel):
    """kombu's filesystem channel with atomic writes, claims that survive a crash, bad files set aside."""

    QoS = QoS

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.folders = BrokerFolders.from_options(self.transport_options)
        self._claim_folder: ClaimFolder | None = None
        # Delivery tag -> its claimed file. Kept by the transport: kombu may
        # reject or restore a message through another channel than the one
        # that took it (a message for a queue with no consumer).
        self._claims: dict[str, Path] = connection.claims
        self._no_ack_queues: set[str] = set()
        # One listing of queue/ serves every queue until one of them runs dry, and
        # is redone at most once per polling interval, and no sooner than
        # LISTING_SPACING_FACTOR times its own duration: with a backlog in one
        # queue, polling the empty ones (Celery's remote control queue) must not
        # keep the consumer busy listing the folder (docs/broker.md, "Latency").
        self._pending: dict[str, deque[str]] = {}
        self._next_listing = float("-inf")
        self._next_recovery = 0.0

    # kombu's _size and _purge read these.
    @cached_property
    def data_folder_in(self) -> str:
        return str(self.folders.queue)

    @cached_property
    def data_folder_out(self) -> str:
        return str(self.folders.queue)

    # --- sending -------------------------------------------------------------
    # kombu's two base classes name the second argument differently (message / payload);
    # kombu passes it by position.
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = message_file_name(queue)
        try:
            write_atomically(self.folders.incoming, self.folders.queue / name, dumps(message).encode())
        except OSError as exc:
            raise ChannelError(f"cannot add a message to {self.folders.queue}: {exc.strerror}") from exc

    # --- receiving -----------------------------------------------------------
    def _get(self, queue: str, timeout: float | None = None) -> dict:
        now = time.monotonic()
        if now >= self._next_recovery:
            self._next_recovery = now + RECOVER_EVERY_SECONDS
            recover_abandoned_claims(self.folders)
        pending = self._pending_for(queue, now)
        while pending:
            name = pending.popleft()
            claimed = self._claim(name)
            if claimed is None:
                continue
            payload = self._read_claimed(claimed)
            if payload is None:
                continue
            tag = payload["properties"]["delivery_tag"]
            if queue in self._no_ack_queues:
                self._unlink(claimed)  # nobody will acknowledge it
            else:
                self._claims[tag] = claimed
            return payload
        raise Empty()

    def _pending_for(self, queue: str, now: float) -> deque[str]:
        pending = self._pending.get(queue)
        if pending:
            return pending
        if now >= self._next_listing:
            started = time.monotonic()
            by_queue: dict[str, deque[str]] = {}
            for name in sorted(os.listdir(self.folders.queue)):
                name_queue = queue_of(name)
                if name_queue is not None:
                    by_queue.setdefault(name_queue, deque()).append(name)
            self._pending = by_queue
            listing_seconds = time.monotonic() - started
            interval = self.connection.polling_interval or DEFAULT_POLLING_INTERVAL_SECONDS
            self._next_listing = started + max(interval, LISTING_SPACING_FACTOR * listing_seconds)
        return self._pending.get(queue) or deque()

    def _claim(self, name: str) -> Path | None:
        """Take a message file for this consumer: one rename, so exactly one consumer gets it."""
        if self._claim_folder is None or self._claim_folder.pid != os.getpid():
            self._claim_folder = ClaimFolder(self.folders.claimed)
            recover_abandoned_claims(self.folders)
        target = self._claim_folder.path / name
        try:
            os.rename(self.folders.queue / name, target)
        except FileNotFoundError:
            return None  # another consumer took it, or the queue was purged
        except OSError as exc:
            raise ChannelError(f"cannot take {name} from {self.folders.queue}: {exc.strerror}") from exc
        return target

    def _read_claimed(self, path: Path) -> dict | None:
        """The message in `path`, or None when it is not one (then it is set aside in bad/)."""
        try:
            payload = loads(path.read_bytes())
            # What the consumer builds from it next: that must not raise there.
            message = self.Message(payload, channel=self)
            if not isinstance(message.delivery_tag, str) or not isinstance(message.delivery_info, dict):
                raise ValueError("no delivery tag or delivery info")
        except Exception as exc:  # anything unreadable, whatever the reason: never raise into the worker
            self._set_aside(path, exc)
            return None
        return payload

    def _set_aside(self, path: Path, reason: Exception) -> None:
        destination = self.folders.bad / path.name
        try:
            os.rename(path, destination)
        except OSError as exc:
            logger.error("broker: unreadable message %s (%s) could not be set aside: %s; deleting it",
                         path.name, reason, exc.strerror)
            self._unlink(path)
            return
        logger.error("broker: set aside unreadable message %s in %s: %s: %s",
                     path.name, self.folders.bad, type(reason).__name__, reason)

    def forget_claim(self, delivery_tag: str) -> None:
        """The message was acknowledged (or rejected for good): its file goes."""
        path = self._claims.pop(delivery_tag, None)
        if path is not None:
            self._unlink(path)

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def _restore(self, message: Any) -> None:
        """Put an unacknowledged message back: its claimed file returns to queue/ under its own name."""
        path = self._claims.pop(message.delivery_tag, None)
        if path is not None:
            try:
                os.rename(path, self.folders.queue / path.name)
                return
            except FileNotFoundError:
                pass
        super()._restore(message)

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)  # its old name sorts before anything sent since

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        else:
            self._no_ack_queues.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack and message.delivery_tag is not None:
            self.forget_claim(message.delivery_tag)
        return message

    def close(self) -> None:
        super().close()  # puts unacknowledged messages back (QoS.restore_unacked_once)
        if self._claim_folder is not None and self._claim_folder.pid == os.getpid():
            self._claim_folder.release()
            self._claim_folder = None

    # --- exchange tables (control/) ----------------------------------------
    @property
    def control_folder(self) -> Path:
        return self.folders.control

    def get_table(self, exchange: str) -> list:
        path = self._exchange_file(exchange)  # type: ignore[attr-defined]  # kombu's, not in its stubs
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return self._bindings_declared_here(exchange)
        except OSError as exc:
            raise ChannelError(f"cannot read {path}: {exc.strerror}") from exc
        try:
            return [filesystem.exchange_queue_t(*row) for row in loads(raw)]
        except (ValueError, TypeError) as exc:
            logger.error("broker: exchange table %s is unreadable (%s); using this process's bindings",
                         path, exc)
            return self._bindings_declared_here(exchange)

    def _bindings_declared_here(self, exchange: str) -> list:
        """What this process bound to `exchange`: better than routing its messages nowhere."""
        try:
            return list(virtual.Channel.get_table(self, exchange))
        except KeyError:
            return []

    def _stored_table(self, exchange: str) -> list:
        """The table as stored (an unreadable one counts as empty: it is about to be rewritten)."""
        path = self._exchange_file(exchange)  # type: ignore[attr-defined]  # kombu's, not in its stubs
        try:
            return [filesystem.exchange_queue_t(*row) for row in loads(path.read_bytes())]
        except (FileNotFoundError, ValueError, TypeError):
            return []

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda rows: rows if binding in rows else [binding, *rows])

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any,
                **kwargs: Any) -> None:
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda rows: [row for row in rows if row != binding])

    def _update_table(self, exchange: str, change: Callable[[list], list]) -> None:
        """Read, change and rewrite one exchange table, one writer at a time; readers need no lock."""
        path = self._exchange_file(exchange)  # type: ignore[attr-defined]  # kombu's, not in its stubs
        try:
            with self._control_lock():
                rows = self._stored_table(exchange)
                changed = change(rows)
                if changed != rows or not path.exists():
                    write_atomically(self.folders.incoming, path, dumps(changed).encode())
        except OSError as exc:
            raise ChannelError(f"cannot update {path}: {exc.strerror}") from exc

    @contextlib.contextmanager
    def _control_lock(self) -> Iterator[None]:
        fd = os.open(self.folders.control / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


_STATE_BY_FOLDER: dict[str, virtual.BrokerState] = {}


class Transport(filesystem.Transport):
    """Select with broker_transport = "gpuadmin.broker.filesystem:Transport"."""

    Channel = Channel
    polling_interval = DEFAULT_POLLING_INTERVAL_SECONDS

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.claims: dict[str, Path] = {}
        # kombu keeps declared bindings in one state per process and skips
        # writing a binding it remembers; a process that talks to two broker
        # folders (or to one made again) must not take one's for the other's.
        root = str(BrokerFolders.from_options(client.transport_options or {}).root)
        self.state = _STATE_BY_FOLDER.setdefault(root, virtual.BrokerState())

    def establish_connection(self) -> Any:
        # Connecting checks that the broker's folders are there and writable,
        # so a health check or a sender learns of a broken broker at once.
        assert self.client is not None  # kombu sets it before connecting
        folders = BrokerFolders.from_options(self.client.transport_options or {})
        try:
            folders.create()
            if not os.access(folders.queue, os.W_OK | os.X_OK):
                raise PermissionError(f"{folders.queue} is not writable")
        except OSError as exc:
            # A connection error: senders and workers retry it as they would a Redis that is down.
            raise BrokerConnectionError(f"embedded broker at {folders.root}: {exc}") from exc
        return super().establish_connection()
