"""The nvml backend against nvidia-smi, on a machine with an NVIDIA GPU.

Without a GPU (no nvidia-smi, or it lists no GPU) it says so and exits 0: there
is nothing to compare. With one:

1. times --init-cycles rounds of nvmlInit + nvmlShutdown (what keeping NVML open
   between probes saves; docs/snapshot.md), and a probe with NVML already open;
2. starts a holder: a child that allocates --mib MiB on the first visible CUDA
   device through the CUDA driver API (libcuda.so.1 by ctypes; --torch: PyTorch)
   and waits;
3. takes a snapshot with the nvml backend and reads
   `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`
   and `nvidia-smi -q -d PIDS`;
4. prints the three side by side and checks: the holder is in all three; every PID
   nvidia-smi lists is in the snapshot (a process row or unmatched_gpu_processes)
   with the same memory to the MiB; the snapshot has no PID nvidia-smi does not
   list; this process is no device holder; the backend gave no reason.

Exit status 1 when a check fails. The holder is stopped before the script ends.

    python benchmarks/nvml_check.py [--mib 512] [--torch] [--init-cycles 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import processes

MiB = 1024**2

HOLDER_CUDA = r"""
import ctypes, sys
mib = int(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
def check(code, what):
    if code != 0:
        print(f"{what} failed: CUresult {code}", flush=True)
        sys.exit(2)
check(cuda.cuInit(0), "cuInit")
device = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
context = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
memory = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(memory), ctypes.c_size_t(mib * 1024 * 1024)), "cuMemAlloc")
print("ready", flush=True)
sys.stdin.read()
"""

HOLDER_TORCH = r"""
import sys, torch
block = torch.empty(int(sys.argv[1]) * 1024 * 1024, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def no_gpu_reason() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not installed"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed: {exc}"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return f"nvidia-smi lists no GPU ({(listed.stdout + listed.stderr).strip()[:200] or 'no output'})"
    return None


def time_init_cycles(cycles: int) -> list[float]:
    import pynvml

    seconds = []
    for _ in range(cycles):
        started = time.perf_counter()
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        seconds.append(time.perf_counter() - started)
    return seconds


def start_holder(mib: int, use_torch: bool) -> subprocess.Popen[str]:
    code = HOLDER_TORCH if use_torch else HOLDER_CUDA
    holder = subprocess.Popen([sys.executable, "-c", code, str(mib)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    line = holder.stdout.readline().strip()
    if line != "ready":
        holder.kill()
        holder.wait()
        raise SystemExit(f"the CUDA holder did not start: {line or 'no output'}")
    return holder


def compute_apps() -> dict[int, int | None]:
    """pid -> MiB (None: [N/A]) from --query-compute-apps, summed over GPUs."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    print("$ nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits")
    print(out.rstrip() or "(none)")
    found: dict[int, int | None] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            found[int(parts[0])] = _add(found.get(int(parts[0]), 0), _mib(parts[2]))
    return found


def pids_section() -> dict[int, int | None]:
    """pid -> MiB from `nvidia-smi -q -d PIDS` (compute and graphics), summed over GPUs."""
    out = subprocess.run(["nvidia-smi", "-q", "-d", "PIDS"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    print("$ nvidia-smi -q -d PIDS")
    print(out.rstrip())
    found: dict[int, int | None] = {}
    pid: int | None = None
    for line in out.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "Process ID" and value.isdigit():
            pid = int(value)
            found.setdefault(pid, 0)
        elif key == "Used GPU Memory" and pid is not None:
            found[pid] = _add(found[pid], _mib(value.removesuffix("MiB").strip()))
    return found


def _mib(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _add(total: int | None, more: int | None) -> int | None:
    return None if total is None or more is None else total + more


def probe_memory(document: dict[str, Any]) -> dict[int, int | None]:
    """pid -> MiB the snapshot gives (process rows and unmatched entries), summed over GPUs."""
    found: dict[int, int | None] = defaultdict(int)
    for row in document["processes"]:
        for used in row["gpu_memory_bytes"].values():
            found[row["pid"]] = _add(found[row["pid"]], None if used is None else used // MiB)
    for entry in document["unmatched_gpu_processes"]:
        used = entry["used_memory_bytes"]
        found[entry["pid"]] = _add(found[entry["pid"]], None if used is None else used // MiB)
    return dict(found)


def compare(probe: dict[int, int | None], smi: dict[int, int | None], label: str, *,
            complete: bool) -> list[str]:
    problems = []
    for pid, mib in sorted(smi.items()):
        if pid not in probe:
            problems.append(f"{label}: pid {pid} is missing from the snapshot")
        elif mib is not None and probe[pid] is not None and abs(probe[pid] - mib) > 1:
            problems.append(f"{label}: pid {pid} holds {mib} MiB, the snapshot says {probe[pid]} MiB")
    if complete:
        problems += [f"{label}: the snapshot lists pid {pid}, nvidia-smi does not"
                     for pid in probe if pid not in smi]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="memory the holder allocates (MiB)")
    parser.add_argument("--torch", action="store_true", help="allocate with PyTorch instead of libcuda")
    parser.add_argument("--init-cycles", type=int, default=5)
    args = parser.parse_args()
    processes.guard()

    reason = no_gpu_reason()
    if reason:
        print(f"No GPU here ({reason}): nothing to compare. Run this on a host with an NVIDIA GPU.")
        return 0

    from gpuadmin.probe.config import ProbeConfig
    from gpuadmin.probe.gpus import nvml
    from gpuadmin.probe.snapshot import take_snapshot

    init_seconds = time_init_cycles(args.init_cycles)
    print(f"nvmlInit + nvmlShutdown, {args.init_cycles} cycles: "
          + ", ".join(f"{s * 1000:.1f} ms" for s in init_seconds))
    config = ProbeConfig(gpu_backend="nvml")
    take_snapshot(config)  # opens NVML, which then stays open
    started = time.perf_counter()
    take_snapshot(config)
    print(f"one snapshot with NVML already open: {(time.perf_counter() - started) * 1000:.1f} ms")

    holder = start_holder(args.mib, args.torch)
    try:
        document = take_snapshot(config)
        apps, pids = compute_apps(), pids_section()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
        nvml.close()

    print("snapshot: driver", document["host"]["driver_version"], "backend", document["gpu_backend"])
    for gpu in document["gpus"]:
        print(f"  GPU {gpu['index']} {gpu['name']} {gpu['uuid']} used {gpu['memory_used_bytes']} "
              f"MIG {gpu.get('mig_instances')}")
    probe = probe_memory(document)
    print("pid -> MiB   snapshot:", probe, "  compute-apps:", apps, "  -q -d PIDS:", pids)

    problems = compare(probe, apps, "compute-apps", complete=False)
    problems += compare(probe, pids, "-q -d PIDS", complete=True)
    if holder.pid not in probe or holder.pid not in apps or holder.pid not in pids:
        problems.append(f"the holder (pid {holder.pid}) is not in all three")
    holders = {row["pid"] for row in document["processes"] if row["device_files"]}
    if os.getpid() in holders:
        problems.append("this process (the agent's stand-in) is listed as a device holder")
    if document["gpu_backend"]["reason"]:
        problems.append(f"the backend gave a reason: {document['gpu_backend']['reason']}")
    for problem in problems:
        print("MISMATCH", problem)
    print("OK: the snapshot agrees with nvidia-smi" if not problems else f"{len(problems)} mismatches")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
