"""kombu's filesystem transport against gpuadmin's embedded broker: publishers and a consumer at once.

Two publisher processes each put --messages messages (20 kB each) into one
queue while this process consumes and acknowledges them as fast as it can,
polling without pause. Run once per transport, on the same machine:

- stock: kombu.transport.filesystem, as Celery's `filesystem://` gives it;
- embedded: gpuadmin.broker.filesystem (docs/broker.md).

For each it prints messages received of sent, errors raised out of `get`
(kombu's race, celery/kombu#1551, shows as JSONDecodeError on a file read
before it was written) and the time taken. Exit status 1 when the embedded
broker lost, duplicated or failed a message.

    python benchmarks/broker_race.py [--messages 5000] [--transport stock|embedded|both]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kombu import Connection

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks import processes  # noqa: E402
from gpuadmin.broker.filesystem import TRANSPORT_PATH  # noqa: E402

QUEUE = "race"
PAYLOAD_PAD = "x" * 20_000
GIVE_UP_SECONDS = 600.0


def connect(root: Path, transport: str) -> Connection:
    if transport == "stock":
        (root / "queue").mkdir(exist_ok=True)
        (root / "control").mkdir(exist_ok=True)
        options = {"data_folder_in": str(root / "queue"), "data_folder_out": str(root / "queue"),
                   "control_folder": str(root / "control"), "polling_interval": 0}
        return Connection("filesystem://localhost/", transport_options=options)
    return Connection("filesystem://localhost/", transport=TRANSPORT_PATH,
                      transport_options={"data_folder": str(root), "polling_interval": 0})


def publish(root: Path, transport: str, publisher: int, count: int) -> None:
    with connect(root, transport) as connection, connection.SimpleQueue(QUEUE) as queue:
        for number in range(count):
            queue.put({"id": f"{publisher}-{number}", "pad": PAYLOAD_PAD})


def race(transport: str, messages: int) -> tuple[collections.Counter, int, float]:
    root = Path(tempfile.mkdtemp(prefix=f"broker-race-{transport}-"))
    try:
        publishers = [multiprocessing.Process(target=publish, args=(root, transport, p, messages))
                      for p in range(2)]
        for publisher in publishers:
            publisher.start()
        received: collections.Counter = collections.Counter()
        errors = 0
        started = time.monotonic()
        with connect(root, transport) as connection, connection.SimpleQueue(QUEUE) as queue:
            while sum(received.values()) < 2 * messages and time.monotonic() - started < GIVE_UP_SECONDS:
                try:
                    message = queue.get(timeout=1)
                except queue.Empty:
                    if not any(p.is_alive() for p in publishers):
                        break
                    continue
                except Exception as exc:  # what a Celery worker would die of
                    errors += 1
                    print(f"  {transport}: get raised {type(exc).__name__}: {exc}")
                    continue
                received[message.payload["id"]] += 1
                message.ack()
        for publisher in publishers:
            publisher.join()
        return received, errors, time.monotonic() - started
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5000, help="per publisher (there are 2)")
    parser.add_argument("--transport", choices=("stock", "embedded", "both"), default="both")
    args = parser.parse_args()
    processes.guard()
    failed = False
    for transport in ("stock", "embedded") if args.transport == "both" else (args.transport,):
        received, errors, seconds = race(transport, args.messages)
        sent = 2 * args.messages
        duplicated = sum(1 for count in received.values() if count > 1)
        print(f"{transport:<9} received {len(received)} of {sent}, {duplicated} duplicated, "
              f"{errors} errors raised, {seconds:.1f} s")
        if transport == "embedded":
            failed = len(received) != sent or duplicated > 0 or errors > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
