"""The embedded broker (gpuadmin/broker/filesystem.py) under real publishers and a real Celery worker.

The worker and the publishers are separate processes on one broker folder,
as web, beat and worker are in `make run`. They use tests/broker/hammer_app.py,
a Celery app with one task that appends a line per run, so every delivery
can be counted.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from gpuadmin.broker.filesystem import (
    LOCK_NAME,
    TRANSPORT_PATH,
    BrokerFolders,
    message_file_name,
    write_atomically,
)
from tests.broker.hammer_app import QUEUE

REPO = Path(__file__).resolve().parents[2]
PUBLISHERS = 4
MESSAGES_PER_PUBLISHER = 5_000
# A bound for waits, not a speed requirement: the whole run takes ~45 s under coverage, beside
# the parallel run or alone (tests/README.md).
WAIT_SECONDS = 300.0

PUBLISH = textwrap.dedent("""
    import sys
    from tests.broker.hammer_app import app, record
    publisher, count = int(sys.argv[1]), int(sys.argv[2])
    with app.producer_or_acquire() as producer:
        for number in range(count):
            record.apply_async((publisher, number), producer=producer)
""")

# Takes three messages and never acknowledges them; the test then kills it.
TAKE_THREE_AND_HANG = textwrap.dedent("""
    import time
    from tests.broker.hammer_app import QUEUE, app
    with app.connection_for_read() as connection, connection.SimpleQueue(QUEUE) as queue:
        for _ in range(3):
            message = queue.get(timeout=60)
            print("took", message.payload, flush=True)
        time.sleep(600)
""")

# Takes two messages, acknowledges neither, and closes its connection.
TAKE_TWO_AND_STOP = textwrap.dedent("""
    from tests.broker.hammer_app import QUEUE, app
    with app.connection_for_read() as connection, connection.SimpleQueue(QUEUE) as queue:
        for _ in range(2):
            queue.get(timeout=60)
""")

# Malformed files a queue folder may hold: kombu's race left empty ones; the rest, anyone.
BAD_FILES = {
    f"{0:020d}_empty.{QUEUE}.msg": b"",
    f"{0:020d}_notjson.{QUEUE}.msg": b"{\"body\": ",
    f"{0:020d}_notamessage.{QUEUE}.msg": b"{\"hello\": \"world\"}",
    f"{0:020d}_badbody.{QUEUE}.msg": (b'{"body": "a", "properties": {"body_encoding": "base64", '
                                      b'"delivery_tag": "x", "delivery_info": {}}}'),
}


def hammer_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HAMMER_BROKER_DIR": str(tmp_path / "broker"),
            "HAMMER_RECORD": str(tmp_path / "record.txt"), "PYTHONUNBUFFERED": "1"}


def connect(folders: BrokerFolders, **options: Any) -> Connection:
    """A kombu connection of this process to the broker in `folders` (`options`: more transport options)."""
    return Connection("filesystem://localhost/", transport=TRANSPORT_PATH,
                      transport_options={"data_folder": str(folders.root), **options})


def start(argv: list[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen:
    output = log.open("wb") if log else subprocess.PIPE
    return subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True)


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    return start([sys.executable, "-m", "celery", "-A", "tests.broker.hammer_app", "worker", "-P", "solo",
                  "-Q", QUEUE, "--without-gossip", "--without-mingle", "--without-heartbeat",
                  "--loglevel", "WARNING"], env, log)


def stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def wait_until(what: str, check, log: Path | None = None) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {WAIT_SECONDS:.0f} s"
                                 + (f":\n{log.read_text()[-4000:]}" if log else ""))
        time.sleep(0.2)


def recorded(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


@pytest.mark.slow  # 20,000 messages through a real Celery worker: tens of seconds
def test_many_publishers_and_a_worker_deliver_every_message_once_and_bad_files_are_set_aside(
    tmp_path: Path,
) -> None:
    env = hammer_env(tmp_path)
    folders = BrokerFolders(tmp_path / "broker")
    record, log = tmp_path / "record.txt", tmp_path / "worker.log"
    worker = start_worker(env, log)
    publishers = [start([sys.executable, "-c", PUBLISH, str(p), str(MESSAGES_PER_PUBLISHER)], env)
                  for p in range(PUBLISHERS)]
    try:
        # Malformed files arrive while the queue is busy; each must be set aside, the rest delivered.
        wait_until("the first thousand deliveries", lambda: len(recorded(record)) >= 1000, log)
        for name, content in BAD_FILES.items():
            (folders.queue / name).write_bytes(content)
        for publisher in publishers:
            assert publisher.wait(timeout=WAIT_SECONDS) == 0, publisher.stdout.read()
        total = PUBLISHERS * MESSAGES_PER_PUBLISHER
        wait_until("every delivery", lambda: len(recorded(record)) >= total, log)
        wait_until("the bad files set aside", lambda: len(os.listdir(folders.bad)) == len(BAD_FILES), log)

        assert worker.poll() is None, log.read_text()[-4000:]
        counts = collections.Counter(recorded(record))
        expected = {f"{p} {n}" for p in range(PUBLISHERS) for n in range(MESSAGES_PER_PUBLISHER)}
        assert set(counts) == expected
        assert [line for line, count in counts.items() if count > 1] == []
        assert sorted(os.listdir(folders.bad)) == sorted(BAD_FILES)
        worker_log = log.read_text()
        assert worker_log.count("broker: set aside unreadable message") == len(BAD_FILES), worker_log
        assert "Unrecoverable error" not in worker_log
        assert os.listdir(folders.queue) == [] and os.listdir(folders.incoming) == []
        # The one consumer's claim folder holds nothing but its lock: every message was acknowledged.
        [claim_folder] = os.listdir(folders.claimed)
        assert os.listdir(folders.claimed / claim_folder) == [LOCK_NAME]
        for folder in (folders.root, folders.queue, folders.incoming, folders.claimed, folders.bad,
                       folders.control):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    finally:
        for process in [worker, *publishers]:
            stop(process)


def test_messages_taken_by_a_consumer_that_died_go_back_to_the_queue_once(tmp_path: Path) -> None:
    env = hammer_env(tmp_path)
    folders = BrokerFolders(tmp_path / "broker")

    with connect(folders) as connection, connection.SimpleQueue(QUEUE) as queue:
        for number in range(5):
            queue.put({"number": number})
    consumer = start([sys.executable, "-c", TAKE_THREE_AND_HANG], env)
    try:
        taken = [consumer.stdout.readline().decode() for _ in range(3)]
        assert all(line.startswith("took") for line in taken), taken
        [claim_folder] = os.listdir(folders.claimed)
        claimed_files = [n for n in os.listdir(folders.claimed / claim_folder) if n != LOCK_NAME]
        assert len(claimed_files) >= 3  # on disk in the data folder, not only in the consumer's memory
        assert stat.S_IMODE((folders.claimed / claim_folder / claimed_files[0]).stat().st_mode) == 0o600
    finally:
        stop(consumer)  # SIGKILL: no chance to put anything back itself

    received = []
    with connect(folders) as connection, connection.SimpleQueue(QUEUE) as queue:
        while True:
            try:
                message = queue.get(timeout=2)
            except queue.Empty:
                break
            received.append(message.payload["number"])
            message.ack()
    assert sorted(received) == [0, 1, 2, 3, 4]
    assert os.listdir(folders.queue) == []
    assert os.listdir(folders.claimed) == []  # the dead consumer's folder is gone, and ours


def test_a_consumer_that_stops_puts_its_unacknowledged_messages_back_under_their_own_names(
    tmp_path: Path,
) -> None:
    folders = BrokerFolders(tmp_path / "broker")
    env = hammer_env(tmp_path)
    with connect(folders) as connection, connection.SimpleQueue(QUEUE) as queue:
        for number in range(3):
            queue.put({"number": number})
    sent = sorted(os.listdir(folders.queue))
    consumer = start([sys.executable, "-c", TAKE_TWO_AND_STOP], env)
    output, _ = consumer.communicate(timeout=WAIT_SECONDS)
    assert consumer.returncode == 0, output
    assert sorted(os.listdir(folders.queue)) == sent
    assert os.listdir(folders.claimed) == []


def test_message_file_names_sort_in_sending_order() -> None:
    names = [message_file_name(QUEUE) for _ in range(1000)]
    assert sorted(names) == names


def test_polling_an_empty_queue_beside_a_backlog_does_not_keep_listing_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery's worker polls its remote-control queue between tasks. A listing of a long backlog
    # costs thousands of times one delivery: it must be spaced out by its cost, not only by the
    # polling interval (which made a traced worker spend most of its time listing).
    folders = BrokerFolders(tmp_path / "broker")
    backlog = 4000
    with connect(folders) as connection, connection.SimpleQueue(QUEUE) as queue:
        queue.put({"number": 0})
    # The rest as copies of kombu's own first file (publishing 4,000 through kombu takes ~20 s
    # under coverage), each with its own number and delivery tag, named in sending order.
    [first] = os.listdir(folders.queue)
    template = json.loads((folders.queue / first).read_bytes())
    for number in range(1, backlog):
        message = {**template, "body": base64.b64encode(json.dumps({"number": number}).encode()).decode(),
                   "properties": {**template["properties"], "delivery_tag": str(uuid.uuid4())}}
        path = folders.queue / message_file_name(QUEUE)
        write_atomically(folders.incoming, path, json.dumps(message).encode())
    listings = 0
    real_listdir = os.listdir

    def counting_listdir(path: Any = ".") -> list[str]:
        nonlocal listings
        listings += Path(path) == folders.queue
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", counting_listdir)
    taken = []
    with connect(folders, polling_interval=0.001) as connection:
        channel = connection.default_channel
        for _ in range(500):
            with contextlib.suppress(Empty):
                channel._get("an-empty-queue")
            taken.append(channel._get(QUEUE))
            time.sleep(0.002)  # two polling intervals: the interval alone would allow a listing each time
        numbers = [channel.Message(m, channel=channel).decode()["number"] for m in taken]
    assert numbers == list(range(500))
    # Unspaced, every poll of the empty queue listed 4,000 files again: 500 listings.
    assert listings <= 50, listings
