"""The probe against the manual procedure it replaces, on a busy process table.

Spawns --processes real processes (by default 2,000: 10% zombies, some holding
a temporary "device" file that stands in for /dev/nvidia*), then measures, in
one run and over --repeats rounds (median, rounds interleaved so that noise
hits every contender alike):

  manual     `ps -eo pid,ppid,stat,etimes,user,comm,args` then `fuser -v <device files>`
             (the seed's checklist; wall time of both commands, output captured)
  cli        the whole `python -m gpuadmin.probe --json --device-glob <glob> --gpu-backend none`
             process, interpreter start-up included
  in-process one take_snapshot() in a long-running process (an agent), warm
  psutil     for reference: the same table through psutil.process_iter (why the probe
             reads /proc itself)

Required: cli <= 0.5 x manual; aim 0.25 x. Exit status 1 when the requirement is missed.
Every process spawned is killed and reaped before the script ends, even on error
or Ctrl+C (the script makes itself a child subreaper, so orphans come back to it).

    python benchmarks/probe_vs_manual.py [--processes 2000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import glob
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import processes  # noqa: E402
from gpuadmin.probe.config import ProbeConfig  # noqa: E402
from gpuadmin.probe.snapshot import take_snapshot  # noqa: E402

CHILDREN_PER_PARENT = 100
REQUIREMENT_PROCESSES = 1000  # the requirement (cli <= 0.5 x manual) is stated for a full server's table


def check_limits(wanted: int) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    in_use = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    soft_nproc, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    room = pid_max - in_use
    if soft_nproc != resource.RLIM_INFINITY:
        room = min(room, soft_nproc - in_use)
    print(f"pid_max {pid_max}, PIDs in use {in_use}, RLIMIT_NPROC {soft_nproc}: room for {room}")
    if wanted + 100 > room:
        sys.exit(f"not enough PIDs for {wanted} processes; lower --processes")


class Crowd:
    """Forking parents, each in its own process group, with CHILDREN_PER_PARENT children:
    sleepers, device holders (open the device file, then sleep) and zombies
    (exit at once; the parent never waits)."""

    def __init__(self) -> None:
        self.parent_pids: list[int] = []

    def spawn(self, total: int, zombie_ratio: float, holders: int, device_path: str) -> None:
        zombies_left = round(total * zombie_ratio)
        holders_left = holders
        remaining = total
        while remaining > 0:
            # The parent itself counts as one of the processes.
            children = min(CHILDREN_PER_PARENT, remaining - 1)
            kinds = []
            for _ in range(children):
                if zombies_left:
                    kinds.append("zombie")
                    zombies_left -= 1
                elif holders_left:
                    kinds.append("holder")
                    holders_left -= 1
                else:
                    kinds.append("sleeper")
            self._spawn_parent(kinds, device_path)
            remaining -= children + 1

    def _spawn_parent(self, kinds: list[str], device_path: str) -> None:
        ready_read, ready_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the forking parent
            try:
                os.close(ready_read)
                os.setpgid(0, 0)
                for kind in kinds:
                    if os.fork() == 0:
                        if kind == "zombie":
                            os._exit(0)
                        os.close(ready_write)
                        if kind == "holder":
                            os.open(device_path, os.O_RDONLY)
                        while True:
                            signal.pause()
                os.write(ready_write, b"k")
                while True:
                    signal.pause()
            finally:
                os._exit(1)
        os.close(ready_write)
        with contextlib.suppress(OSError):  # the child did it already: fine
            os.setpgid(pid, pid)
        self.parent_pids.append(pid)
        if os.read(ready_read, 1) != b"k":
            raise RuntimeError("a forking parent failed to start its children")
        os.close(ready_read)

    def stop(self) -> None:
        for pid in self.parent_pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        # Everything comes back to us (subreaper): reap until no child is left.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.01)
        print("warning: some children were not reaped within 60 s", file=sys.stderr)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def ps() -> None:
    subprocess.run(["ps", "-eo", "pid,ppid,stat,etimes,user,comm,args"], capture_output=True, check=True)


def fuser(device_glob: str) -> None:
    # The shell would expand the glob for fuser; so do we.
    subprocess.run(["fuser", "-v", *sorted(glob.glob(device_glob))], capture_output=True, check=False)


def cli(device_glob: str) -> bytes:
    command = [sys.executable, "-m", "gpuadmin.probe", "--json", "--device-glob", device_glob,
               "--gpu-backend", "none"]
    return subprocess.run(command, capture_output=True, check=True, cwd=REPO).stdout


def psutil_pass() -> None:
    import psutil

    attrs = ["pid", "ppid", "status", "create_time", "username", "name", "cmdline"]
    for _ in psutil.process_iter(attrs):
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument("--zombie-ratio", type=float, default=0.10)
    parser.add_argument("--device-holders", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    check_limits(args.processes)
    # As an installed package would be: compiled once, so the CLI does not compile its modules
    # at every start (PYTHONDONTWRITEBYTECODE would otherwise make it).
    compileall.compile_dir(REPO / "gpuadmin" / "probe", quiet=1)
    processes.guard()
    crowd = Crowd()
    with tempfile.TemporaryDirectory(prefix="gpuadmin-bench-") as tmp:
        device_path = os.path.join(tmp, "fake-nvidia0")
        Path(device_path).write_bytes(b"")
        device_glob = os.path.join(tmp, "fake-nvidia*")
        try:
            started = time.perf_counter()
            crowd.spawn(args.processes, args.zombie_ratio, args.device_holders, device_path)
            print(f"spawned {args.processes} processes in {time.perf_counter() - started:.1f} s "
                  f"({len(crowd.parent_pids)} forking parents)")
            return measure(args, device_glob)
        finally:
            crowd.stop()


def measure(args: argparse.Namespace, device_glob: str) -> int:
    import json

    config = ProbeConfig(gpu_backend="none", device_glob=device_glob)
    document = take_snapshot(config)  # warm-up: imports, passwd cache
    counts = document["process_counts"]
    holders = sum(1 for p in document["processes"] if p["device_files"])
    print(f"snapshot sees {counts['total']} processes, {counts['zombies']} zombies, "
          f"{holders} device holders, {len(document['processes'])} processes that matter")
    cli_document = json.loads(cli(device_glob))
    assert cli_document["process_counts"]["zombies"] >= round(args.processes * args.zombie_ratio)
    assert sum(1 for p in cli_document["processes"] if p["device_files"]) >= args.device_holders

    timings: dict[str, list[float]] = {"manual": [], "  ps": [], "  fuser": [], "cli": [], "in-process": [],
                                       "psutil": []}
    for _ in range(args.repeats):
        timings["  ps"].append(timed(ps))
        timings["  fuser"].append(timed(lambda: fuser(device_glob)))
        timings["manual"].append(timings["  ps"][-1] + timings["  fuser"][-1])
        timings["cli"].append(timed(lambda: cli(device_glob)))
        timings["in-process"].append(timed(lambda: take_snapshot(config)))
        timings["psutil"].append(timed(psutil_pass))

    baseline = statistics.median(timings["manual"])
    print(f"\n{'contender':<12} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'x manual':>9}")
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"{name:<12} {median * 1000:>10.1f} {min(values) * 1000:>8.1f} {max(values) * 1000:>8.1f} "
              f"{median / baseline:>9.2f}")
    ratio = statistics.median(timings["cli"]) / baseline
    verdict = "meets the aim (<= 0.25)" if ratio <= 0.25 else (
        "meets the requirement (<= 0.5)" if ratio <= 0.5 else "MISSES the requirement (<= 0.5)")
    if args.processes < REQUIREMENT_PROCESSES:
        # The CLI's fixed start-up (~40 ms) outweighs a small table: the ratio says nothing there.
        verdict = f"not judged (the requirement is for {REQUIREMENT_PROCESSES} or more processes)"
    print(f"\ncli / manual = {ratio:.2f}: {verdict}  [{args.repeats} rounds, {os.cpu_count()} CPUs]")
    return 0 if ratio <= 0.5 or args.processes < REQUIREMENT_PROCESSES else 1


if __name__ == "__main__":
    sys.exit(main())
