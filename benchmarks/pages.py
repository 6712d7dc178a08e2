"""Response times of the pages and the API over a large fleet.

In a throwaway data directory (SQLite), ingest one snapshot per host through
the real path (tests.factories -> tests.keys.deliver -> gpuadmin.fleet.intake.ingest.receive_snapshot):
--hosts hosts with 8 GPUs each, a dozen GPU-holding processes under two
launchers, an orphaned worker pair still holding memory, a leaky parent with
zombie children and a zombie whose parent is gone, a device-file holder; plus
one big host whose snapshot lists --big-holders GPU holders (100 launchers,
several children each, spread over its 8 GPUs). Then, as a logged-in
superuser through django.test.Client (the whole request path: middleware,
views, templates or DRF renderers; no network), time each request
--repeats times after two warm-up requests and print the median and p95
with the response size.

    python benchmarks/pages.py [--hosts 200] [--big-holders 2000] [--repeats 20]

Exit status 1 when a request does not answer 200.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.django_bench import setup_django, throwaway_data_dir  # noqa: E402

WARM_UP_REQUESTS = 2
GPUS_PER_HOST = 8
BIG_HOST = "gpu-big"
LAUNCHERS_ON_BIG_HOST = 100
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]


def gpu_uuid(host_index: int, gpu_index: int) -> str:
    return f"GPU-{host_index:08x}-{gpu_index:04x}-4000-8000-00000000bench"


def typical_host(host_index: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Processes and GPUs of an ordinary busy host."""
    from tests.factories import GiB, gpu, proc

    uuids = [gpu_uuid(host_index, i) for i in range(GPUS_PER_HOST)]
    used = [0] * GPUS_PER_HOST
    processes: list[dict[str, Any]] = []
    for launcher in range(2):
        parent = 1000 + launcher * 100
        owner = USERS[(host_index + launcher) % len(USERS)]
        processes.append(proc(parent, user=owner, name="torchrun", reasons=["ancestor"],
                              elapsed_seconds=86400,
                              cmdline=["torchrun", "--nproc-per-node", "6", "train.py", "--cfg", "a.yaml"]))
        for rank in range(6):
            gpu_index = launcher * 4 + rank % 4
            memory = (10 + rank) * GiB
            used[gpu_index] += memory
            processes.append(proc(parent + 1 + rank, ppid=parent, user=owner, name="python", reasons=["gpu"],
                                  cmdline=["python", "-u", "train.py", f"--local-rank={rank}"],
                                  gpu_memory={uuids[gpu_index]: memory}, elapsed_seconds=86000,
                                  device_files=[f"/dev/nvidia{gpu_index}", "/dev/nvidiactl",
                                                "/dev/nvidia-uvm"]))
    for rank in range(2):  # a worker pair whose launcher died
        used[7] += 6 * GiB
        processes.append(proc(2001 + rank, ppid=1, user=USERS[host_index % len(USERS)], name="python",
                              orphaned=True, pgid=2000, sid=2000, reasons=["gpu"], elapsed_seconds=7200,
                              cmdline=["python", "worker.py", "--rank", str(rank)],
                              gpu_memory={uuids[7]: 6 * GiB}))
    processes.append(proc(3000, user="dave", name="leaky-parent", reasons=["ancestor"], elapsed_seconds=900,
                          cmdline=["leaky-parent", "--forks", "6"]))
    processes += [proc(pid, ppid=3000, state="Z", user="dave", name="child", cmdline=[], reasons=["zombie"])
                  for pid in range(3001, 3007)]
    processes.append(proc(3100, ppid=98765, state="Z", user="frank", name="lost", cmdline=[],
                          reasons=["zombie"]))
    processes.append(proc(3200, user="carol", name="nvidia-smi", cmdline=["nvidia-smi", "-l", "1"],
                          device_files=["/dev/nvidia0", "/dev/nvidiactl"], reasons=["device"]))
    gpus = [gpu(i, uuid=uuids[i], used=used[i] + 1 * GiB, utilization_percent=(host_index * 7 + i * 13) % 101)
            for i in range(GPUS_PER_HOST)]
    return processes, gpus


def big_host(holders: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A host with ``holders`` GPU holders (plus their launchers, a few zombies and orphans)."""
    from tests.factories import GiB, gpu, proc

    host_index = 0xB16
    uuids = [gpu_uuid(host_index, i) for i in range(GPUS_PER_HOST)]
    used = [0] * GPUS_PER_HOST
    processes: list[dict[str, Any]] = []
    per_launcher = -(-holders // LAUNCHERS_ON_BIG_HOST)
    for n in range(holders):
        launcher, rank = divmod(n, per_launcher)
        parent = 10_000 + launcher * 1000
        owner = USERS[launcher % len(USERS)]
        if rank == 0:
            processes.append(proc(parent, user=owner, name="ray::launcher", reasons=["ancestor"],
                                  cmdline=["python", "-m", "ray.launcher", f"--job={launcher}"]))
        gpu_index = n % GPUS_PER_HOST
        memory = (256 + n % 512) * 2**20
        used[gpu_index] += memory
        processes.append(proc(parent + 1 + rank, ppid=parent, user=owner, name="ray::worker", reasons=["gpu"],
                              cmdline=["python", "-m", "ray.worker", f"--worker-id={n:05d}"],
                              gpu_memory={uuids[gpu_index]: memory}, elapsed_seconds=60.0 + n,
                              device_files=[f"/dev/nvidia{gpu_index}", "/dev/nvidiactl"]))
    processes.append(proc(900, user="dave", name="leaky-parent", reasons=["ancestor"],
                          cmdline=["leaky-parent"]))
    processes += [proc(pid, ppid=900, state="Z", user="dave", name="child", cmdline=[], reasons=["zombie"])
                  for pid in range(901, 921)]
    for rank in range(4):
        used[rank] += 2 * GiB
        processes.append(proc(500 + rank, ppid=1, user="erin", name="python", orphaned=True,
                              pgid=499, sid=499, cmdline=["python", "dist.py", f"--rank={rank}"],
                              reasons=["gpu"],
                              gpu_memory={uuids[rank]: 2 * GiB}))
    gpus = [gpu(i, uuid=uuids[i], total=141 * GiB, used=used[i] + GiB, utilization_percent=100)
            for i in range(GPUS_PER_HOST)]
    return processes, gpus


def ingest_fleet(hosts: int, big_holders: int) -> tuple[float, float, int]:
    """Ingest every host; return (seconds for the ordinary hosts, seconds for the big one, its bytes)."""
    from tests.factories import snapshot_json
    from tests.keys import deliver

    began = time.perf_counter()
    for host_index in range(hosts):
        processes, gpus = typical_host(host_index)
        deliver(snapshot_json(f"gpu{host_index:03d}", processes=processes, gpus=gpus))
    fleet_seconds = time.perf_counter() - began
    processes, gpus = big_host(big_holders)
    payload = snapshot_json(BIG_HOST, processes=processes, gpus=gpus)
    began = time.perf_counter()
    deliver(payload)
    return fleet_seconds, time.perf_counter() - began, len(payload)


def percentile(values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (what numpy calls 'linear')."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def time_request(client: Any, label: str, path: str, repeats: int, headers: dict[str, str]) -> dict[str, Any]:
    timings = []
    response = None
    for n in range(WARM_UP_REQUESTS + repeats):
        began = time.perf_counter()
        response = client.get(path, **headers)
        elapsed = time.perf_counter() - began
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} ({label}) answered {response.status_code}")
        if n >= WARM_UP_REQUESTS:
            timings.append(elapsed)
    assert response is not None
    return {"label": label, "path": path, "median": statistics.median(timings),
            "p95": percentile(timings, 0.95), "bytes": len(response.content), "response": response}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--big-holders", type=int, default=2000, help="GPU holders on the one big host")
    parser.add_argument("--repeats", type=int, default=20, help="timed requests per row (after 2 warm-ups)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    if args.hosts < 0 or args.big_holders < 1 or args.repeats < 1:
        parser.error("--hosts must be >= 0, --big-holders and --repeats >= 1")

    with throwaway_data_dir("gpuadmin-bench-pages-", wait=not args.no_wait):
        return run(args)


def run(args: argparse.Namespace) -> int:
    setup_django()
    from django.contrib.auth import get_user_model
    from django.test import Client

    fleet_seconds, big_seconds, big_bytes = ingest_fleet(args.hosts, args.big_holders)
    admin = get_user_model().objects.create_superuser("bench-admin", password=uuid.uuid4().hex)
    client = Client()
    client.force_login(admin)

    htmx = {"HTTP_HX_REQUEST": "true"}
    big = f"/hosts/{BIG_HOST}/"
    rows = [
        ("fleet page", "/", {}),
        ("fleet, htmx poll", "/", htmx),
        ("API host list", "/api/v1/hosts/", {}),
        ("big host page", big, {}),
        ("big host, htmx poll", big, htmx),
        ("big host, htmx processes", big, {**htmx, "HTTP_HX_TARGET": "host-processes"}),
        ("API big host", f"/api/v1/hosts/{BIG_HOST}/", {}),
        ("ordinary host page", "/hosts/gpu000/" if args.hosts else big, {}),
    ]
    try:
        results = [time_request(client, label, path, args.repeats, headers) for label, path, headers in rows]
    except RuntimeError as error:
        print(f"FAILED: {error}", file=sys.stderr)
        return 1

    listed = json.loads(results[2]["response"].content)
    detail = json.loads(results[6]["response"].content)
    print(f"{args.hosts} hosts x {GPUS_PER_HOST} GPUs, {len(listed)} listed by the API; big host: "
          f"{args.big_holders} GPU holders ({big_bytes / 2**20:.1f} MiB snapshot); "
          f"{args.repeats} requests per row; {os.cpu_count()} CPUs")
    print(f"ingest: {args.hosts} ordinary hosts {fleet_seconds:.1f} s "
          f"({1000 * fleet_seconds / max(args.hosts, 1):.1f} ms each); big host {1000 * big_seconds:.0f} ms")
    print()
    print(f"{'request':28}{'path':28}{'median ms':>10}{'p95 ms':>9}{'KiB':>9}")
    for r in results:
        print(f"{r['label']:28}{r['path']:28}{1000 * r['median']:10.1f}{1000 * r['p95']:9.1f}"
              f"{r['bytes'] / 1024:9.1f}")
    if len(listed) != args.hosts + 1 or not isinstance(detail, dict):
        print(f"FAILED: the API listed {len(listed)} hosts, expected {args.hosts + 1}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
