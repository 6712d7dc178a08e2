"""What taking snapshot updates off Redis costs central's worker per message, four ways side by side.

A redis-server of its own (tests/services.py's ``redis_server``). ``--messages`` snapshot updates of
``--bytes`` each are queued by ``gpuadmin.sending.send_snapshot_update`` (as agents send them; not
timed), then taken off and decoded four ways, ``--repeats`` times each, timing this process's CPU:

- kombu's consumer, as ``fleet.update_batches.UpdateBatchConsumer`` takes them where ``RedisTaker`` does
  not serve (a key prefix, no event loop): each message delivered by a BRPOP of its own, recorded in
  kombu's unacknowledged set, acknowledged one by one (at least once);
- kombu without acknowledgement (``no_ack``: at most once, nothing recorded);
- ``gpuadmin.broker.redis_taking.RedisTaker``, as ``UpdateBatchConsumer`` takes them on Redis: ``BATCH_MAX``
  popped and recorded in kombu's unacknowledged set by one script, acknowledged together (at least once);
- a Redis stream (XADD of the same bodies), read by a consumer group ``BATCH_MAX`` at a time and
  acknowledged with one XACK per batch (at least once: what is read stays pending until acknowledged).

Also redis-server's own CPU per message taken (its ``INFO cpu``). Checks that each way took every
message once and left nothing queued or pending. The batches' own work (``receive_snapshot_updates``)
is not here: ``snapshot_updates.py`` and ``fleet_soak.py`` have it.

    python benchmarks/update_consumption.py [--messages 5000] [--bytes 1500] [--repeats 3] [--no-wait]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import django_with_redis  # noqa: E402

STREAM, GROUP = "bench.updates", "central"
DRAIN_TIMEOUT_SECONDS = 10


def fake_update(size_bytes: int, n: int) -> dict[str, Any]:
    """A signed update's shape (``text`` and ``signature``); nothing here checks the signature."""
    return {"text": f"{n:08}" + "u" * max(0, size_bytes - 96), "signature": "s" * 88}


def queue_updates(count: int, size_bytes: int) -> None:
    from gpuadmin.sending import send_snapshot_update

    for n in range(count):
        send_snapshot_update(fake_update(size_bytes, n))


def kombu_way(*, no_ack: bool) -> Callable[[Any, int], int]:
    def take(connection: Any, count: int) -> int:
        from kombu import Consumer

        from gpuadmin.celery import CENTRAL_UPDATES_QUEUE, app
        from gpuadmin.fleet.update_batches import BATCH_MAX, PREFETCH_BATCHES

        taken: list[Any] = []
        channel = connection.channel()
        consumer = Consumer(channel, queues=[app.amqp.queues[CENTRAL_UPDATES_QUEUE]], accept=["json"],
                            on_message=lambda message: taken.append((message, message.decode()[0][0])),
                            no_ack=no_ack, prefetch_count=None if no_ack else PREFETCH_BATCHES * BATCH_MAX)
        consumer.consume()
        done = 0
        try:
            while done < count:
                connection.drain_events(timeout=DRAIN_TIMEOUT_SECONDS)
                for message, _ in taken:
                    if not no_ack:
                        message.ack()
                done += len(taken)
                taken.clear()
        finally:
            consumer.cancel()
            channel.close()
        return done

    return take


def taker_way(connection: Any, count: int) -> int:
    from gpuadmin.broker.redis_taking import RedisTaker
    from gpuadmin.celery import CENTRAL_UPDATES_QUEUE
    from gpuadmin.fleet.update_batches import BATCH_MAX

    channel = connection.channel()
    taker = RedisTaker(channel, CENTRAL_UPDATES_QUEUE)
    done = 0
    try:
        while done < count:
            taken = taker.take(BATCH_MAX)
            if not taken:
                raise SystemExit(f"the taker gave {done} of {count} messages")
            for message in taken:
                message.decode()
                message.ack()
            taker.send_acks()
            done += len(taken)
    finally:
        channel.close()
    return done


def stream_way(connection: Any, count: int) -> int:
    from gpuadmin.fleet.update_batches import BATCH_MAX

    client = connection.default_channel.client
    done = 0
    while done < count:
        reply = client.xreadgroup(GROUP, "bench", {STREAM: ">"}, count=BATCH_MAX,
                                  block=DRAIN_TIMEOUT_SECONDS * 1000)
        if not reply:
            raise SystemExit(f"the stream gave {done} of {count} messages")
        ids = []
        for _, entries in reply:
            for entry_id, fields in entries:
                json.loads(fields[b"body"])
                ids.append(entry_id)
        client.xack(STREAM, GROUP, *ids)
        done += len(ids)
    return done


def fill_stream(connection: Any, count: int, size_bytes: int) -> None:
    client = connection.default_channel.client
    pipe = client.pipeline(transaction=False)
    for n in range(count):
        pipe.xadd(STREAM, {"body": json.dumps([[fake_update(size_bytes, n)], {}, {}])})
    pipe.execute()


def server_cpu_seconds(client: Any) -> float:
    """redis-server's own CPU so far (its INFO), the broker's share of each way."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def left_behind(connection: Any) -> dict[str, int]:
    from gpuadmin.celery import CENTRAL_UPDATES_QUEUE

    client = connection.default_channel.client
    pending = client.xpending(STREAM, GROUP)["pending"] if client.exists(STREAM) else 0
    return {key: value for key, value in {
        "queued": int(client.llen(CENTRAL_UPDATES_QUEUE)), "unacknowledged": int(client.hlen("unacked")),
        "pending in the stream": int(pending)}.items() if value}


def measure(args: argparse.Namespace) -> None:
    from gpuadmin.celery import app

    ways: dict[str, Callable[[Any, int], int]] = {
        "kombu, acknowledged one by one": kombu_way(no_ack=False),
        "kombu, no acknowledgement": kombu_way(no_ack=True),
        "RedisTaker, 200 taken and acknowledged at once": taker_way,
        "a stream, 200 read and acknowledged at once": stream_way,
    }
    figures: dict[str, list[float]] = {label: [] for label in ways}
    server_figures: dict[str, list[float]] = {label: [] for label in ways}
    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        for _ in range(args.repeats):
            for label, take in ways.items():
                if take is stream_way:
                    fill_stream(connection, args.messages, args.bytes)
                else:
                    queue_updates(args.messages, args.bytes)
                began, server_began = time.process_time(), server_cpu_seconds(client)
                taken = take(connection, args.messages)
                figures[label].append(1000 * (time.process_time() - began) / args.messages)
                server_seconds = server_cpu_seconds(client) - server_began
                server_figures[label].append(1000 * server_seconds / args.messages)
                left = left_behind(connection)
                if taken != args.messages or left:
                    raise SystemExit(f"{label}: took {taken} of {args.messages}; left {left}")
            client.xtrim(STREAM, maxlen=0)
    print(f"{'how':50}{'CPU ms per message (median, min-max)':>40}{'redis-server (median)':>24}")
    for label, values in figures.items():
        print(f"{label:50}{statistics.median(values):20.3f} ({min(values):.3f}-{max(values):.3f})"
              f"{statistics.median(server_figures[label]):24.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--bytes", type=int, default=1500, help="each update's signed text, about")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    processes.guard()
    print("command: python benchmarks/update_consumption.py "
          + " ".join(sys.argv[1:] if argv is None else argv))
    with django_with_redis("gpuadmin-bench-consume-", wait=not args.no_wait):
        print(f"{args.messages} messages of ~{args.bytes} bytes, {args.repeats} rounds each way, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
