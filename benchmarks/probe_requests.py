"""Central's cost of asking hosts for probes (beat's ``schedule_probes``, every interval, one per host).

A redis-server of its own (tests/services.py's ``redis_server``); ``--hosts`` probe requests sent by
``gpuadmin.sending.request_probe`` one at a time (each builds its message and takes the pool's
producer), then the same through ``request_probes`` (what ``fleet.probes.send_due_probes`` sends with:
the round's message built once, each host's copy published on one producer), side by side,
``--repeats`` times each. Prints the CPU milliseconds of this process per request (the
publish's own share included) and checks that every request reached its host's queue.

    python benchmarks/probe_requests.py [--hosts 2000] [--repeats 3] [--no-wait]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import django_with_redis  # noqa: E402


def measure(args: argparse.Namespace) -> None:
    from gpuadmin.celery import app, host_queue
    from gpuadmin.sending import request_probe, request_probes

    names = [f"gpu{n:05}" for n in range(args.hosts)]

    def one_by_one() -> None:
        for name in names:
            request_probe(name)

    def one_message() -> None:
        request_probes(names)

    request_probe("warm-up")
    figures: dict[str, list[float]] = {"request_probe, one by one": [],
                                       "request_probes, one message a round": []}
    for _ in range(args.repeats):
        for label, send in zip(figures, (one_by_one, one_message), strict=True):
            began = time.process_time()
            send()
            figures[label].append(1000 * (time.process_time() - began) / len(names))
    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        queued = [client.llen(host_queue(name)) for name in names]
    if queued != [2 * args.repeats] * len(names):
        raise SystemExit(f"probe requests lost: {sum(queued)} queued of {2 * args.repeats * len(names)}")
    print(f"{'how':38}{'CPU ms per request (median, min-max)':>40}")
    for label, values in figures.items():
        print(f"{label:38}{statistics.median(values):20.3f} ({min(values):.3f}-{max(values):.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    processes.guard()
    print("command: python benchmarks/probe_requests.py " + " ".join(sys.argv[1:] if argv is None else argv))
    with django_with_redis("gpuadmin-bench-probes-", wait=not args.no_wait):
        print(f"{args.hosts} hosts, {args.repeats} rounds each way, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}")
        measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
