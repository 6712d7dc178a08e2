"""The orphan shapes of docs/snapshot.md, made with real processes, probed and killed through the executor.

For each scenario the script starts processes that hold GPU memory, puts them in
the scenario's shape, takes a snapshot (``gpuadmin.probe.snapshot.take_snapshot``),
kills them with a signed order executed by ``gpuadmin.probe.kill.execute_order``
(SIGINT, SIGTERM, SIGKILL, ``--grace-seconds`` each; the order is signed with a
key made on the spot and verified against it, pinned as an agent pins central's),
and checks that the GPU memory came back:

- ``setsid-launcher``: the launcher leads its group and session and is SIGKILLed;
- ``script-launcher``: a shell leads the session, the script's job its group, and
  the launcher under it (which leads nothing) is SIGKILLed;
- ``batch-launcher``: the session and group leader lives on (a Slurm batch script)
  while the launcher under it is SIGKILLed;
- ``torchrun-rank``: an agent with two ranks, one of which is SIGKILLed: its workers
  are orphans, the other rank's are not;
- ``ignores-signals``: orphans that ignore SIGINT and SIGTERM, so only SIGKILL ends them;
- ``leader-exited``: a holder whose main thread exited while another thread holds
  the memory (/proc says Z; the process lives);
- ``pid-namespace``: holders in another PID namespace (``unshare --pid --fork``,
  with ``--user --map-root-user`` when not root); skipped where the host forbids it.

Two backends:

- ``--backend nvml`` (default): every holder allocates ``--holders-mib`` MiB with
  PyTorch (``torch.empty(..., device="cuda")``) and the memory is read with
  ``nvidia-smi``. Without a GPU, or without PyTorch, it says so and exits 0.
- ``--backend simulated``: no GPU, no PyTorch. Holders are plain processes that
  hold a stand-in device file open; this script plays the driver: it lists them
  in a simulated GPU file (gpuadmin/probe/gpus/simulated.py) and drops a holder's
  memory once its process has exited entirely (its pidfd says so: a process whose
  leader exited keeps its memory). The memory is read from the probe's own GPU
  reading. Everything else (the processes, the probe, the executor) is real.

One line per scenario: the shape, orphaned as the probe saw it and as expected,
the kill's signals and how long the execution took, the GPU memory before and
after (MiB), PASS or FAIL. Exit status 1 when any expectation fails.

    python benchmarks/gpu_check.py [--backend nvml|simulated] [--holders-mib 1024] [--grace-seconds 2]

It needs only psutil, nvidia-ml-py and cryptography beside this source tree (no
Django): it imports gpuadmin.probe, gpuadmin.wire and benchmarks/processes.py.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MiB = 1024**2
WORKER = "_worker"  # argv[1] of this script run as one of its own processes
READY_TIMEOUT_SECONDS = {"nvml": 180.0, "simulated": 20.0}
# Each step of the kill's plan: a PyTorch process tears its CUDA context down on its way out.
GRACE_SECONDS = {"nvml": 5.0, "simulated": 2.0}  # main()'s --grace-seconds help says these
RELEASE_TIMEOUT_SECONDS = {"nvml": 30.0, "simulated": 5.0}
POLL_SECONDS = 0.02


# --- the processes the scenarios are made of (this file, run as `gpu_check.py _worker SPEC`) -------


def host_pid() -> int:
    """This process's PID as the host sees it: /proc here is the host's, even in another PID namespace."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    return os.getpid()


def idle_forever() -> None:
    while True:
        time.sleep(3600)


def reap_forever() -> None:
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.05)


def fork(body: Any) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid


def hold(spec: dict[str, Any], report_fd: int) -> None:
    """Take the memory (PyTorch) or the stand-in device file, write this process's host PID to
    ``report_fd``, and stay; the main thread exits first with ``leader_exit``."""
    if spec.get("ignore"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if spec["backend"] == "nvml":
            import torch  # type: ignore[import-not-found,unused-ignore]  # only on a GPU host

            held = torch.empty(spec["mib"] * MiB, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
        else:
            held = os.open(spec["device"], os.O_RDONLY)
    except Exception as exc:
        os.write(report_fd, f"error {type(exc).__name__}: {exc}".replace("\n", " ").encode() + b"\n")
        os._exit(3)
    mine = host_pid()
    if not spec.get("leader_exit"):
        os.write(report_fd, f"{mine}\n".encode())
        idle_forever()

    def leader_state() -> str:
        # /proc/self, read from any thread, is the process's entry: the leader's state.
        with open("/proc/self/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]

    def live_on() -> None:
        while leader_state() != "Z":
            time.sleep(0.01)
        os.write(report_fd, f"{mine}\n".encode())
        _ = held
        idle_forever()

    threading.Thread(target=live_on).start()
    ctypes.CDLL(None).pthread_exit(None)  # ctypes lets go of the GIL first


def fork_holders(spec: dict[str, Any]) -> list[int]:
    """Forks spec["count"] holders and returns their host PIDs once each holds its memory."""
    reports_read, reports_write = os.pipe()
    for _ in range(spec["count"]):
        fork(lambda: hold(spec, reports_write))
    pids = []
    with os.fdopen(reports_read) as reports:
        for _ in range(spec["count"]):
            line = reports.readline().strip()
            if not line.isdigit():
                ready(error=line or "a holder died before it held its memory")
                os._exit(3)
            pids.append(int(line))
    return pids


def ready(**fields: Any) -> None:
    sys.stdout.write(json.dumps({"pid": host_pid(), **fields}) + "\n")
    sys.stdout.flush()


def worker(spec: dict[str, Any]) -> None:
    kind = spec["kind"]
    if kind == "holder":  # holds itself (its own session, as spawned: no orphan)
        read_end, write_end = os.pipe()
        threading.Thread(target=lambda: relay(read_end)).start()
        hold(spec, write_end)
    elif kind == "launcher":  # forks the holders (under unshare: PID 1 of the namespace)
        ready(launcher=host_pid(), holders=fork_holders(spec))
        reap_forever()
    elif kind == "job":
        job(spec)
    elif kind == "agent":  # torchrun's agent: two ranks, each with its workers
        reports_read, reports_write = os.pipe()

        def rank() -> None:
            os.write(reports_write, json.dumps({"rank": os.getpid(), "workers": fork_holders(spec)}).encode()
                     + b"\n")
            reap_forever()

        for _ in range(2):
            fork(rank)
        with os.fdopen(reports_read) as reports:
            ranks = [json.loads(reports.readline()) for _ in range(2)]
        ready(launcher=ranks[0]["rank"], holders=ranks[0]["workers"], bystanders=ranks[1]["workers"])
        reap_forever()
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


def relay(read_end: int) -> None:
    """A lone holder's report: its PID, once it holds (and, leader_exit, once its leader exited)."""
    with os.fdopen(read_end) as reports:
        line = reports.readline().strip()
    if line.isdigit():
        ready(holders=[int(line)])
    else:
        ready(error=line)


def job(spec: dict[str, Any]) -> None:
    """A launcher that leads nothing under a parent that lives on (tests/probe/programs/workloads.py):
    ``batch``: this process leads session and group, the launcher is its child (a Slurm batch
    script); ``script``: this process leads the session (a shell), its child leads a group of its
    own (a job) and runs the launcher (a script run without job control)."""
    reports_read, reports_write = os.pipe()

    def run_launcher() -> None:
        holders = fork_holders(spec)
        os.write(reports_write, json.dumps({"launcher": os.getpid(), "holders": holders}).encode() + b"\n")
        reap_forever()

    def script() -> None:
        os.setpgid(0, 0)
        fork(run_launcher)
        reap_forever()

    fork(script if spec["shape"] == "script" else run_launcher)
    with os.fdopen(reports_read) as reports:
        ready(**json.loads(reports.readline()))
    reap_forever()


# --- the check --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    worker: dict[str, Any]
    orphaned: bool  # what the probe must say of "holders" ("bystanders" never are)
    exits_on: str  # the plan's step that ends them
    kill_first: bool = False  # SIGKILL the report's "launcher" before probing
    leader_exit: bool = False
    namespace: bool = False


SCENARIOS = [
    Scenario("setsid-launcher", {"kind": "launcher"}, orphaned=True, exits_on="SIGINT", kill_first=True),
    Scenario("script-launcher", {"kind": "job", "shape": "script"}, orphaned=True, exits_on="SIGINT",
             kill_first=True),
    Scenario("batch-launcher", {"kind": "job", "shape": "batch"}, orphaned=True, exits_on="SIGINT",
             kill_first=True),
    Scenario("torchrun-rank", {"kind": "agent"}, orphaned=True, exits_on="SIGINT", kill_first=True),
    Scenario("ignores-signals", {"kind": "launcher", "ignore": True}, orphaned=True, exits_on="SIGKILL",
             kill_first=True),
    # Python runs its SIGINT handler in the main thread only, which is gone: SIGTERM's default ends it.
    Scenario("leader-exited", {"kind": "holder", "count": 1, "leader_exit": True}, orphaned=False,
             exits_on="SIGTERM", leader_exit=True),
    Scenario("pid-namespace", {"kind": "launcher"}, orphaned=False, exits_on="SIGINT", namespace=True),
]
PLAN_SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")


@dataclass
class Outcome:
    orphaned_seen: list[bool] = field(default_factory=list)
    orphaned_expected: list[bool] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    kill_seconds: float = 0.0
    before_mib: float = 0.0
    after_mib: float = 0.0
    problems: list[str] = field(default_factory=list)
    skipped: str = ""


class SimulatedDriver:
    """The driver of the simulated GPU: memory appears when a holder holds, and goes when its
    process has exited entirely (pidfd readable: a zombie holds nothing, a process whose leader
    exited holds on)."""

    UUID = "GPU-gpu-check-0"

    def __init__(self, directory: Path) -> None:
        self.path = directory / "gpus.json"
        self.device = directory / "nvidia0"
        self.device.touch()
        self.held: dict[int, tuple[int, int]] = {}  # pid -> (pidfd, bytes)
        self.write()

    def allocate(self, pid: int, used_bytes: int) -> None:
        self.held[pid] = (os.pidfd_open(pid), used_bytes)
        self.write()

    def settle(self) -> None:
        for pid, (pidfd, _used) in list(self.held.items()):
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            if poller.poll(0):
                os.close(pidfd)
                del self.held[pid]
        self.write()

    def write(self) -> None:
        document = {
            "gpus": [{"uuid": self.UUID, "name": "Simulated GPU", "memory_total_bytes": 80 * 1024 * MiB,
                      "extra_used_bytes": 0}],
            "processes": [{"pid": pid, "gpu_uuid": self.UUID, "used_memory_bytes": used}
                          for pid, (_fd, used) in self.held.items()],
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document))
        os.replace(temporary, self.path)


class Check:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        from gpuadmin.probe.config import ProbeConfig
        from gpuadmin.probe.journal import Journal
        from gpuadmin.wire.signing import generate_private_key, public_key_text

        self.args = args
        self.backend: str = args.backend
        self.driver = SimulatedDriver(workdir) if self.backend == "simulated" else None
        if self.driver is not None:
            self.config = ProbeConfig(gpu_backend="simulated", simulated_gpus_path=str(self.driver.path),
                                      device_glob=str(workdir / "nvidia*"))
        else:
            self.config = ProbeConfig(gpu_backend="nvml")
        self.journal = Journal(workdir / "journal")
        self.key = generate_private_key()
        self.pinned = public_key_text(self.key)  # as an agent pins central's key

    # -- memory, as the driver reports it

    def gpu_used_mib(self) -> float:
        if self.driver is not None:
            self.driver.settle()
            document = self.snapshot()
            return sum(gpu["memory_used_bytes"] or 0 for gpu in document["gpus"]) / MiB
        out = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")
        return float(sum(int(line) for line in out.split() if line.isdigit()))

    def gpu_pids(self) -> set[int]:
        if self.driver is not None:
            self.driver.settle()
            document = self.snapshot()
            pids = {row["pid"] for row in document["processes"] if row["gpu_memory_bytes"]}
            return pids | {entry["pid"] for entry in document["unmatched_gpu_processes"]}
        out = smi("--query-compute-apps=pid", "--format=csv,noheader,nounits")
        return {int(line) for line in out.split() if line.isdigit()}

    def snapshot(self) -> dict[str, Any]:
        from gpuadmin.probe.snapshot import take_snapshot

        return take_snapshot(self.config)

    # -- one scenario

    def run(self, scenario: Scenario) -> Outcome:
        from benchmarks import processes

        outcome = Outcome()
        prefix: list[str] = []
        if scenario.namespace:
            prefix, outcome.skipped = namespace_prefix()
            if outcome.skipped:
                return outcome
        spec = {"count": self.args.workers, **scenario.worker, "backend": self.backend,
                "mib": self.args.holders_mib, "device": str(self.driver.device) if self.driver else ""}
        argv = [*prefix, sys.executable, os.path.abspath(__file__), WORKER, json.dumps(spec)]
        started = processes.spawn(argv, stdout=subprocess.PIPE, text=True)
        try:
            report = read_report(started, READY_TIMEOUT_SECONDS[self.backend])
            self.check(scenario, report, outcome, started)
        finally:
            processes.stop(started, grace_seconds=2.0)
            reap_children()
        return outcome

    def check(self, scenario: Scenario, report: dict[str, Any], outcome: Outcome,
              started: subprocess.Popen[str]) -> None:
        holders: list[int] = report["holders"]
        bystanders: list[int] = report.get("bystanders", [])
        targets = holders + bystanders
        if self.driver is not None:
            for pid in targets:
                self.driver.allocate(pid, self.args.holders_mib * MiB)
        if scenario.kill_first:
            kill_launcher(report["launcher"], started, holders)

        document = self.snapshot()
        rows = {row["pid"]: row for row in document["processes"]}
        missing = [pid for pid in targets if pid not in rows]
        if missing:
            outcome.problems.append(f"the snapshot does not list holders {missing}")
            return
        outcome.orphaned_seen = [rows[pid]["orphaned"] for pid in targets]
        outcome.orphaned_expected = [scenario.orphaned] * len(holders) + [False] * len(bystanders)
        if outcome.orphaned_seen != outcome.orphaned_expected:
            outcome.problems.append("the probe's orphaned differs from the shape's")
        if scenario.leader_exit and not all(rows[pid].get("leader_exited") for pid in targets):
            outcome.problems.append("the probe did not mark the holder leader_exited")
        outcome.before_mib = self.gpu_used_mib()
        before_pids = self.gpu_pids()
        if not set(targets) <= before_pids:
            outcome.problems.append(f"holders {sorted(set(targets) - before_pids)} hold no GPU memory before "
                                    "the kill")

        finished = self.kill([rows[pid] for pid in targets], outcome)
        if finished["result"] != "succeeded":
            outcome.problems.append(f"the kill {finished['result']}: {finished['detail']}")
        exits = {target["pid"]: (target["outcome"], target["signals_sent"][-1:] or [None])
                 for target in finished["targets"]}
        wrong = {pid: exit for pid, exit in exits.items() if exit != ("exited", [scenario.exits_on])}
        if wrong:
            outcome.problems.append(f"expected every holder to exit on {scenario.exits_on}: {wrong}")

        freed_mib = len(targets) * self.args.holders_mib
        deadline = time.monotonic() + RELEASE_TIMEOUT_SECONDS[self.backend]
        while True:
            outcome.after_mib = self.gpu_used_mib()
            left = set(targets) & self.gpu_pids()
            came_back = not left and outcome.before_mib - outcome.after_mib >= 0.95 * freed_mib
            if came_back or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not came_back:
            outcome.problems.append(f"the memory did not come back: {outcome.before_mib:.0f} -> "
                                    f"{outcome.after_mib:.0f} MiB (expected at least {freed_mib} MiB less), "
                                    f"still held by {sorted(left)}")

    def kill(self, rows: list[dict[str, Any]], outcome: Outcome) -> dict[str, Any]:
        """A signed order for these snapshot rows, verified as an agent does, executed."""
        from gpuadmin.probe import procfs
        from gpuadmin.probe.kill import execute_order
        from gpuadmin.wire.kill_order import verify_order
        from gpuadmin.wire.kill_protocol import ORDER_VERSION
        from gpuadmin.wire.signing import MessageKind, seal
        from gpuadmin.wire.timestamps import wire_time

        now = datetime.now(UTC)
        order = {
            "order_version": ORDER_VERSION,
            "request_id": f"gpu-check-{uuid.uuid4().hex[:12]}",
            "host": self.config.host_name,
            "boot_id": procfs.read_boot_id(),
            "deadline": wire_time(now + timedelta(minutes=10)),
            # As central copies a target from the snapshot.
            "targets": [{"pid": row["pid"], "start_time_ticks": row["start_time_ticks"], "uid": row["uid"],
                         "user": row["user"] or str(row["uid"]), "name": row["name"],
                         "cmdline_sha256": row["cmdline_sha256"]} for row in rows],
            "plan": [{"signal": name, "grace_seconds": self.args.grace_seconds} for name in PLAN_SIGNALS],
            "approved_by": "gpu_check",
            "approved_at": wire_time(now),
        }
        message = seal(order, MessageKind.ORDER, self.key)
        verified = verify_order(message, central_key=self.pinned, host_name=self.config.host_name,
                                now=time.time())
        events: list[dict[str, Any]] = []
        started = time.perf_counter()
        finished = execute_order(verified, journal=self.journal, report=events.append)
        outcome.kill_seconds = time.perf_counter() - started
        outcome.signals = list(dict.fromkeys(event["signal"] for event in events
                                             if event["event"] == "signal_sent"))
        return finished


def read_report(started: subprocess.Popen[str], timeout_seconds: float) -> dict[str, Any]:
    assert started.stdout is not None
    readable, _, _ = select.select([started.stdout], [], [], timeout_seconds)
    line = started.stdout.readline() if readable else ""
    if not line:
        raise RuntimeError(f"the scenario's processes did not start within {timeout_seconds:g} s "
                           f"(exit status {started.poll()})")
    report: dict[str, Any] = json.loads(line)
    if "error" in report:
        raise RuntimeError(f"a holder could not take its memory: {report['error']}")
    return report


def kill_launcher(launcher: int, started: subprocess.Popen[str], holders: list[int]) -> None:
    """SIGKILL the launcher; return once its parent reaped it and its holders were adopted."""
    from gpuadmin.probe import procfs

    os.kill(launcher, signal.SIGKILL)
    if launcher == started.pid:
        started.wait(timeout=10)
    deadline = time.monotonic() + 10
    while procfs.read_stat(launcher) is not None or any(
            (stat := procfs.read_stat(pid)) is not None and stat.ppid == launcher for pid in holders):
        if time.monotonic() > deadline:
            raise RuntimeError(f"launcher {launcher} was not reaped, or its holders not adopted, within 10 s")
        time.sleep(POLL_SECONDS)


def reap_children() -> None:
    """Reap the killed holders this script adopted (it is a child subreaper)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def namespace_prefix() -> tuple[list[str], str]:
    """(the unshare command for a new PID namespace, "" ) or ([], why not) on this host."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return [], "unshare is not installed"
    prefix = [unshare, "--pid", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    tried = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30, check=False)
    if tried.returncode != 0:
        return [], f"this host allows no new PID namespace ({tried.stderr.strip()[:200] or tried.returncode})"
    return prefix, ""


def smi(*arguments: str) -> str:
    return subprocess.run(["nvidia-smi", *arguments], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def no_torch_reason() -> str | None:
    import importlib.util

    return "PyTorch is not installed" if importlib.util.find_spec("torch") is None else None


def line_for(scenario: Scenario, outcome: Outcome) -> str:
    if outcome.skipped:
        return f"{scenario.name:<16} SKIPPED: {outcome.skipped}"
    seen, expected = ("/".join("yes" if orphaned else "no" for orphaned in flags) or "?"
                      for flags in (outcome.orphaned_seen, outcome.orphaned_expected))
    steps = "→".join(outcome.signals) or "none"
    verdict = "PASS" if not outcome.problems else "FAIL: " + "; ".join(outcome.problems)
    return (f"{scenario.name:<16} orphaned {seen} (expected {expected})  "
            f"kill {steps} in {outcome.kill_seconds:.2f} s  "
            f"memory {outcome.before_mib:.0f} -> {outcome.after_mib:.0f} MiB  {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backend", choices=("nvml", "simulated"), default="nvml")
    parser.add_argument("--holders-mib", type=int, default=1024, help="GPU memory each holder takes (MiB)")
    parser.add_argument("--workers", type=int, default=2,
                        help="holders per launcher (at least 2: a lone one reads as a daemon)")
    parser.add_argument("--grace-seconds", type=float,
                        help="each step of the kill's plan (default: 5 with nvml, 2 simulated)")
    parser.add_argument("--only", action="append", choices=[s.name for s in SCENARIOS],
                        help="run only this scenario (repeatable)")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers must be at least 2")
    if args.grace_seconds is None:
        args.grace_seconds = GRACE_SECONDS[args.backend]

    from benchmarks import processes

    processes.guard()
    if args.backend == "nvml":
        from benchmarks.nvml_check import no_gpu_reason

        reason = no_gpu_reason() or no_torch_reason()
        if reason:
            print(f"No GPU check here ({reason}). Run this on a host with an NVIDIA GPU and PyTorch, "
                  "or use --backend simulated.")
            return 0

    failed = 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        check = Check(args, Path(workdir))
        print(f"backend {args.backend}, {args.holders_mib} MiB per holder, {args.workers} holders per "
              f"launcher, plan {' → '.join(f'{s} {args.grace_seconds:g} s' for s in PLAN_SIGNALS)}")
        for scenario in SCENARIOS:
            if args.only and scenario.name not in args.only:
                continue
            try:
                outcome = check.run(scenario)
            except Exception as exc:  # one scenario's failure, reported; the others still run
                outcome = Outcome(problems=[f"{type(exc).__name__}: {exc}"])
            print(line_for(scenario, outcome), flush=True)
            failed += bool(outcome.problems)
        if args.backend == "nvml":
            from gpuadmin.probe.gpus import nvml

            nvml.close()
    print("all scenarios passed" if not failed else f"{failed} scenario(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER:
        worker(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
