"""How big the agent's signed snapshot is when a user floods the host, before and after the budget.

Starts one launcher that forks --workers real processes, each holding a
temporary "device" file (standing in for /dev/nvidia*), all with --argument-bytes
of control characters in their command line (six bytes each once escaped as JSON),
takes one real snapshot and prints, for each limit, the signed message's size as
sent, the rows kept and what ``left_out`` says (gpuadmin/probe/budget.py).

    python benchmarks/snapshot_budget.py [--workers 400] [--argument-bytes 4096] [--limits 8388608,262144]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import processes
from gpuadmin.probe.budget import envelope_size, seal_snapshot
from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.snapshot import take_snapshot
from gpuadmin.wire.signing import MessageKind, generate_private_key, seal

WORKLOADS = Path(__file__).resolve().parents[1] / "tests" / "probe" / "programs" / "workloads.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=400)
    parser.add_argument("--argument-bytes", type=int, default=4096)
    parser.add_argument("--limits", default="8388608,1048576,262144")
    options = parser.parse_args()
    processes.guard()
    with tempfile.TemporaryDirectory() as directory:
        device = Path(directory) / "fake-nvidia0"
        device.write_bytes(b"")
        launcher = subprocess.Popen(
            [sys.executable, str(WORKLOADS), "launcher", str(device), str(options.workers),
             "\x01" * options.argument_bytes],
            stdout=subprocess.PIPE,
        )
        assert launcher.stdout is not None
        children = json.loads(launcher.stdout.readline())["children"]
        try:
            document = take_snapshot(ProbeConfig(device_glob=f"{directory}/fake-nvidia*", gpu_backend="none"))
            key = generate_private_key()
            unfitted = seal(document, MessageKind.SNAPSHOT, key)
            print(f"{options.workers} workers x {options.argument_bytes} B arguments: "
                  f"{len(document['processes'])} rows; unfitted signed text {len(unfitted['text']):,} B, "
                  f"message {envelope_size(unfitted):,} B")
            for limit in (int(part) for part in options.limits.split(",")):
                started = time.perf_counter()
                message = seal_snapshot(document, key, max_bytes=limit)
                seconds = time.perf_counter() - started
                body = json.loads(message["text"])
                print(f"limit {limit:>10,} B: message {envelope_size(message):>10,} B, text "
                      f"{len(message['text']):>10,} B, rows {len(body['processes'])}, "
                      f"left_out {body.get('left_out')}, fitted in {seconds:.2f} s")
        finally:
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            launcher.kill()
            launcher.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
