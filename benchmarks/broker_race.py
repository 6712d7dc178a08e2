"""kombu's filesystem transport against gpuadmin's embedded broker: publishers and a consumer at once.

Two publisher processes each put --messages messages (20 kB each) into one
queue while this process consumes and acknowledges them as fast as it can,
polling without pause. Run once per transport, on the same machine:

- stock: kombu.transport.filesystem, as Celery's `filesystem://` gives it;
- embedded: gpuadmin.broker.filesystem (docs/broker.md).

For each it prints messages received of sent (and lost), duplicated, the
errors the transport raised in any process, by where and kind (kombu's race,
celery/kombu#1551, shows as JSONDecodeError on a message or exchange table
read before it was written, in `get`, in a publisher's `put` or while declaring
the queue), and the time taken. Whatever the stock transport raises is counted
as its failure, never raised out of the script. Exit status 1 when the
embedded broker lost, duplicated or raised on a message.

    python benchmarks/broker_race.py [--messages 5000] [--transport stock|embedded|both]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import queue as queue_module
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kombu import Connection
from kombu.transport import filesystem as stock_filesystem
from kombu.transport import virtual

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks import processes  # noqa: E402
from gpuadmin.broker.filesystem import TRANSPORT_PATH  # noqa: E402

QUEUE = "race"
PAYLOAD_PAD = "x" * 20_000
GIVE_UP_SECONDS = 600.0
SHOWN_PER_KIND = 3  # lines printed for each kind of error in each process; every one is counted
RESTART_PAUSE_SECONDS = 0.05
REPORT_TIMEOUT_SECONDS = 10.0
# Once the publishers are done, a transport whose `get` raised this many times running is given up on.
GET_ERRORS_IN_A_ROW = 100


def connect(root: Path, transport: str) -> Connection:
    if transport == "stock":
        (root / "queue").mkdir(exist_ok=True)
        (root / "control").mkdir(exist_ok=True)
        options = {"data_folder_in": str(root / "queue"), "data_folder_out": str(root / "queue"),
                   "control_folder": str(root / "control"), "polling_interval": 0}
        return Connection("filesystem://localhost/", transport_options=options)
    return Connection("filesystem://localhost/", transport=TRANSPORT_PATH,
                      transport_options={"data_folder": str(root), "polling_interval": 0})


def publish(root: Path, transport: str, publisher: int, count: int, report: multiprocessing.Queue) -> None:
    """Put `count` messages; what the transport raises is counted, sent back, and the publisher goes on."""
    errors: collections.Counter = collections.Counter()
    try:
        with connect(root, transport) as connection, connection.SimpleQueue(QUEUE) as queue:
            for number in range(count):
                try:
                    queue.put({"id": f"{publisher}-{number}", "pad": PAYLOAD_PAD})
                except Exception as exc:  # what a Celery client would get from apply_async
                    note(errors, transport, "put", exc)
    except Exception as exc:  # declaring the queue or closing: the messages not yet put are lost
        note(errors, transport, "publisher", exc)
    report.put(dict(errors))  # one small item: the child's exit never waits on a full pipe


def note(errors: collections.Counter, transport: str, where: str, exc: Exception) -> None:
    kind = f"{where}: {type(exc).__name__}"
    if errors[kind] < SHOWN_PER_KIND:
        print(f"  {transport}: {where} raised {type(exc).__name__}: {exc}", flush=True)
    errors[kind] += 1


@dataclass
class Outcome:
    transport: str
    sent: int
    received: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)  # "where: exception" -> count
    seconds: float = 0.0

    @property
    def lost(self) -> int:
        return self.sent - len(self.received)

    @property
    def duplicated(self) -> int:
        return sum(1 for count in self.received.values() if count > 1)

    @property
    def failed(self) -> bool:
        return self.lost > 0 or self.duplicated > 0 or sum(self.errors.values()) > 0

    def line(self) -> str:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.errors.items()))
        return (f"{self.transport:<9} received {len(self.received)} of {self.sent} ({self.lost} lost), "
                f"{self.duplicated} duplicated, {sum(self.errors.values())} errors raised"
                f"{f' ({kinds})' if kinds else ''}, {self.seconds:.1f} s")


def consume(root: Path, outcome: Outcome, publishers: list[multiprocessing.Process], started: float) -> None:
    """Get and acknowledge until every message came or the publishers are gone and the queue is empty.

    An error out of `get` is counted and the loop goes on; one anywhere else (declaring the queue,
    decoding, acknowledging) is counted and the consumer starts over, as a restarted worker would.
    """
    transport = outcome.transport
    while time.monotonic() - started < GIVE_UP_SECONDS:
        finished = not any(p.is_alive() for p in publishers)  # before the attempt: nothing comes after it
        before = sum(outcome.received.values())
        try:
            with connect(root, transport) as connection, connection.SimpleQueue(QUEUE) as queue:
                failing_gets = 0
                while sum(outcome.received.values()) < outcome.sent:
                    if time.monotonic() - started >= GIVE_UP_SECONDS:
                        return
                    finished = not any(p.is_alive() for p in publishers)
                    try:
                        message = queue.get(timeout=1)
                    except queue.Empty:
                        if finished:
                            return
                        continue
                    except Exception as exc:  # what a Celery worker would die of
                        note(outcome.errors, transport, "get", exc)
                        failing_gets += 1
                        if finished and failing_gets > GET_ERRORS_IN_A_ROW:  # it will not recover
                            return
                        continue
                    failing_gets = 0
                    outcome.received[message.payload["id"]] += 1
                    message.ack()
                return
        except Exception as exc:
            note(outcome.errors, transport, "consumer", exc)
            if finished and sum(outcome.received.values()) == before:  # would fail the same way forever
                return
            time.sleep(RESTART_PAUSE_SECONDS)


def race(transport: str, messages: int) -> Outcome:
    """Two publishers and this process's consumer on one fresh folder; whatever the transport raises is
    in the outcome, never raised from here."""
    root = Path(tempfile.mkdtemp(prefix=f"broker-race-{transport}-"))
    if transport == "stock":
        # kombu's filesystem transport remembers the bindings declared in this process and skips writing
        # them again: in a new folder, a second race would route every message nowhere.
        stock_filesystem.Transport.global_state = virtual.BrokerState()
    outcome = Outcome(transport, sent=2 * messages)
    report: multiprocessing.Queue = multiprocessing.Queue()
    try:
        publishers = [multiprocessing.Process(target=publish, args=(root, transport, p, messages, report))
                      for p in range(2)]
        started = time.monotonic()
        for publisher in publishers:
            publisher.start()
        consume(root, outcome, publishers, started)
        outcome.seconds = time.monotonic() - started
        for publisher in publishers:
            publisher.join()
        reported = 0
        while reported < len(publishers):
            try:
                outcome.errors.update(report.get(timeout=REPORT_TIMEOUT_SECONDS))
            except queue_module.Empty:
                break
            reported += 1
        for publisher in publishers:
            if publisher.exitcode != 0:  # died before it could report (its traceback is above)
                outcome.errors[f"publisher: exit status {publisher.exitcode}"] += 1
        return outcome
    finally:
        report.close()
        shutil.rmtree(root, ignore_errors=True)


def compare(transports: Sequence[str], messages: int) -> int:
    """Race each transport in turn and print its outcome. Exit status 1 only when the embedded broker
    lost, duplicated or raised: the stock transport failing is what this shows, not a failure of it."""
    failed = False
    for transport in transports:
        outcome = race(transport, messages)
        print(outcome.line(), flush=True)
        if transport == "embedded":
            failed = failed or outcome.failed
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5000, help="per publisher (there are 2)")
    parser.add_argument("--transport", choices=("stock", "embedded", "both"), default="both")
    args = parser.parse_args()
    processes.guard()
    return compare(("stock", "embedded") if args.transport == "both" else (args.transport,), args.messages)


if __name__ == "__main__":
    sys.exit(main())
