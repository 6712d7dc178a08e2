"""Instructions per snapshot of ingest, this tree against another: an A/B the machine's speed cannot move.

On the shared 2-CPU VM these benchmarks run on, CPU time moves with the
neighbours: even two versions run side by side (``ingest_side_by_side.py``)
give ratios spread over ±5 % when one runs against itself, which hides a
change of a few percent. The instructions a process executes do not depend
on how fast the machine runs them. Here:

1. one PostgreSQL (``tests/services.py``) and ``--hosts`` synthetic hosts
   (``gpuadmin.fleet.synthetic``), enrolled by this tree's code, dated in the
   past; the database is then copied once per tree (``CREATE DATABASE ...
   TEMPLATE``), so both trees store the same snapshots into the same state;
2. per tree, one process under valgrind's callgrind, instrumentation off
   (imports, Django, ``--warm`` rounds of every host: caches and prepared
   statements as in a running worker), then on for ``--rounds`` rounds of
   every host (signed before), then off again;
3. per tree: the instructions of its process per snapshot (the whole client
   side: gpuadmin, Django, psycopg, libpq, msgspec, the C library), and the
   CPU of its PostgreSQL backend per snapshot (real time, so as noisy as
   ever: for scale only).

Both processes run at once (callgrind is single-threaded); each takes a few
minutes. Instruction counts are not time: a cache miss costs more than an
add. They rank changes of the client's work; the rate itself is measured by
``fleet.py``.

    python benchmarks/ingest_instructions.py --base /tmp/base [--hosts 50] [--warm 2] [--rounds 3]

Needs valgrind (Debian's ``valgrind``) and the base tree's migrations equal to
this tree's (checked), as ``ingest_side_by_side.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import setup_django, throwaway_data_dir  # noqa: E402
from benchmarks.fleet import ROUND_SECONDS, enrol_in_the_past  # noqa: E402
from benchmarks.ingest_side_by_side import child_command, migrations  # noqa: E402

# One tree's process: its warm rounds uncounted, then, when told, the counted ones.
_CHILD = r"""
warm, rounds = map(int, more)
messages = [[message(h, r) for h in demo_hosts] for r in range(1, warm + rounds + 1)]
for batch in messages[:warm]:
    for one in batch:
        ingest(one)
settle_worker_process()
connection.ensure_connection()
server_pid = database_server_pid()
print("ready", flush=True)
sys.stdin.readline()
server_before = process_cpu_seconds(server_pid)
for batch in messages[warm:]:
    for one in batch:
        ingest(one)
server = process_cpu_seconds(server_pid) - server_before
print(json.dumps({"snapshots": hosts * rounds, "server": server}), flush=True)
sys.stdin.readline()
"""
_COLLECTED = re.compile(r"Collected : (\d+)")


def start_counting(tree: Path, url: str, args: argparse.Namespace, *, data_dir: str, first_at: float,
                   out_dir: Path) -> subprocess.Popen[str]:
    """``tree``'s process under callgrind, instrumentation off until told (``callgrind_control``)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict and set orders in both trees
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={out_dir / (tree.name + '.%p.out')}",
         *child_command(_CHILD, tree, url, data_dir=data_dir, hosts=args.hosts, processes=args.processes,
                        first_at=first_at, more=(args.warm, args.rounds))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def instrument(process: subprocess.Popen[str], on: bool) -> None:
    subprocess.run(["callgrind_control", f"--instr={'on' if on else 'off'}", str(process.pid)],
                   capture_output=True, check=True, timeout=120)


def counted(processes: dict[str, subprocess.Popen[str]]) -> dict[str, dict[str, float]]:
    """Each process's counted rounds: snapshots, its backend's CPU seconds, its instructions."""
    results: dict[str, dict[str, float]] = {}
    try:
        for name, process in processes.items():
            if process.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                raise SystemExit(f"{name} did not start:\n{process.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        for process in processes.values():
            instrument(process, on=True)
            process.stdin.write("go\n")  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
        for name, process in processes.items():
            line = process.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise SystemExit(f"{name} failed:\n{process.stderr.read()[-3000:]}")  # type: ignore[union-attr]
            instrument(process, on=False)  # not its exit
            results[name] = json.loads(line)
    finally:
        for process in processes.values():
            process.stdin.close()  # type: ignore[union-attr]
    for name, process in processes.items():
        errors = process.stderr.read()  # type: ignore[union-attr]
        process.wait(timeout=300)
        collected = _COLLECTED.search(errors)
        if process.returncode != 0 or collected is None:
            raise SystemExit(f"{name} ended with {process.returncode}:\n{errors[-3000:]}")
        results[name]["instructions"] = int(collected.group(1))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other version's checkout")
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--processes", type=int, default=200, help="relevant processes per snapshot")
    parser.add_argument("--warm", type=int, default=2, help="rounds of every host before counting")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every host counted")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each tree's callgrind file there (for callgrind_annotate: C functions)")
    args = parser.parse_args(argv)
    processes.guard()
    base = args.base.resolve()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if migrations(base) != migrations(REPO):
        raise SystemExit(f"{base} has other migrations than {REPO}: the two cannot share a database")
    print(f"command: python benchmarks/ingest_instructions.py --base {args.base} --hosts {args.hosts} "
          f"--processes {args.processes} --warm {args.warm} --rounds {args.rounds}")
    os.environ["GPUADMIN_PROBE_INTERVAL"] = "3600"  # no host goes offline meanwhile
    from tests import services

    trees = {"this": REPO, "base": base}
    with throwaway_data_dir("instructions-", wait=False), services.postgres_server() as server, \
            tempfile.TemporaryDirectory(prefix="callgrind-") as scratch:
        out = args.keep or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        setup_django(server.url)
        import psycopg
        from django.conf import settings
        from django.db import connections

        from gpuadmin.fleet import synthetic

        logging.disable(logging.WARNING)
        hosts = synthetic.demo_hosts(settings.DATA_DIR, args.hosts, processes=args.processes)
        enrolled_at = enrol_in_the_past(hosts, rounds_to_come=args.warm + args.rounds).timestamp()
        connections.close_all()
        urls = {}
        with psycopg.connect(dataclasses.replace(server, database="postgres").url, autocommit=True) as admin:
            for name in trees:
                admin.execute(f"CREATE DATABASE ingest_{name} TEMPLATE {server.database}")
                urls[name] = dataclasses.replace(server, database=f"ingest_{name}").url
        results = counted({
            name: start_counting(tree, urls[name], args, data_dir=str(settings.DATA_DIR),
                                 first_at=enrolled_at + ROUND_SECONDS, out_dir=out)
            for name, tree in trees.items()
        })
    print(f"{args.hosts} hosts x 8 GPUs, {args.processes} processes each; {args.rounds} rounds counted after "
          f"{args.warm}")
    per_snapshot = {}
    for name, result in results.items():
        n = result["snapshots"]
        per_snapshot[name] = result["instructions"] / n
        print(f"{name}: {per_snapshot[name] / 1e6:.2f} M instructions per snapshot (client); "
              f"PostgreSQL backend {1000 * result['server'] / n:.2f} ms CPU per snapshot")
    ratio = per_snapshot["this"] / per_snapshot["base"]
    print(f"this/base, client instructions per snapshot: {ratio:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
