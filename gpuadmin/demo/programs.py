"""The demo's real processes: ``python -m gpuadmin.demo.programs ROLE [ARG...] [simulated GPU demo]``.

Each role is a real process that behaves as its real-world model does
(signals, children, zombies); only its GPU memory is simulated: it writes a
*claim* (``claims.write_claim``) that the demo's driver turns into the
simulated GPU file the probe reads. No Django here: these start in a blink.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from gpuadmin.demo.claims import GiB, MiB, scenario_dir, write_claim

LABEL = "[simulated GPU demo]"  # the last argument of every demo process: the host page shows it
DDP_WORKERS = 4
ORPHANED_WORKERS = 2
LAUNCHER_LIVES_SECONDS = 3.0
ZOMBIE_EVERY_SECONDS = 5.0
MAX_ZOMBIES = 12
LEAK_BYTES_PER_SECOND = 16 * MiB
# Seen as a command line by the panel: controls, markup, bidi overrides, a very long argument.
HOSTILE_ARGUMENTS = (
    "--name=\x1b[31mrm -rf /\x1b[0m",
    "<script>alert('gpuadmin')</script>",
    "--user=\u202eroot\u202c",
    "line one\nline two\r\x07",
    "--payload=" + "A" * 300,
)


def command(role: str, *args: str) -> list[str]:
    """The argv that starts ``role`` (also the supervisor's Child argv)."""
    return [sys.executable, "-m", "gpuadmin.demo.programs", role, *args, LABEL]


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _start_worker(role: str, *args: str) -> subprocess.Popen[bytes]:
    # Same process group and session as the launcher, as torchrun's workers are.
    return subprocess.Popen(command(role, *args), stdin=subprocess.DEVNULL)


def ddp_launcher(gpus: str) -> None:
    """torchrun-like: DDP_WORKERS ranks over the GPUs given, waits for them; SIGTERM goes to every rank."""
    uuids = gpus.split(",")
    workers = [_start_worker("ddp-worker", f"rank={rank}", uuids[rank % len(uuids)])
               for rank in range(DDP_WORKERS)]

    def forward(signum: int, _frame: object) -> None:
        # Only forward: the loop below is inside Popen.wait, whose lock a handler must not take again.
        for worker in workers:
            if worker.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for worker in workers:
        worker.wait()  # a rank killed through the panel leaves the others running


def ddp_worker(rank: str, gpu: str) -> None:
    write_claim(gpu, 14 * GiB)
    _sleep_forever()


def crashing_launcher(gpu: str) -> None:
    """Starts its workers, then dies by SIGKILL (as an OOM-killed launcher does): they live on, orphaned."""
    for rank in range(ORPHANED_WORKERS):
        _start_worker("orphaned-worker", f"rank={rank}", gpu)
    time.sleep(LAUNCHER_LIVES_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)


def orphaned_worker(rank: str, gpu: str) -> None:
    write_claim(gpu, 9 * GiB)
    _sleep_forever()


def zombie_parent() -> None:
    """Forks short-lived children and never waits for them: a zombie every few seconds."""
    for _ in range(MAX_ZOMBIES):
        if os.fork() == 0:
            os._exit(0)
        time.sleep(ZOMBIE_EVERY_SECONDS)
    _sleep_forever()


def checkpointing_trainer(gpu: str) -> None:
    """Saves a checkpoint on SIGINT and exits: the first step of the panel's signal ladder suffices.

    The handler comes first, as in a real trainer, and its claim after it: once the GPU shows the
    memory, SIGINT saves a checkpoint (before, Python's default handler would only raise).
    """
    checkpoint = scenario_dir() / f"checkpoint-{os.getpid()}.txt"

    def save_and_exit(signum: int, _frame: object) -> None:
        checkpoint.write_text(f"checkpoint written on {signal.Signals(signum).name} at {time.time():.0f}\n")
        print(f"gpuadmin demo trainer: checkpoint saved to {checkpoint}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGINT, save_and_exit)
    write_claim(gpu, 20 * GiB)
    _sleep_forever()


def ignores_sigterm(gpu: str) -> None:
    """Only SIGKILL ends it: the ladder's last step."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    write_claim(gpu, 6 * GiB)
    _sleep_forever()


def hostile_command_line(gpu: str, *_hostile: str) -> None:
    write_claim(gpu, 3 * GiB)
    _sleep_forever()


def slow_leak(gpu: str) -> None:
    write_claim(gpu, 2 * GiB, leak_bytes_per_second=LEAK_BYTES_PER_SECOND)
    _sleep_forever()


def idle_holder(gpu: str) -> None:
    write_claim(gpu, 11 * GiB)
    _sleep_forever()


ROLES: dict[str, Callable[..., None]] = {
    "ddp-launcher": ddp_launcher,
    "ddp-worker": ddp_worker,
    "crashing-launcher": crashing_launcher,
    "orphaned-worker": orphaned_worker,
    "zombie-parent": zombie_parent,
    "checkpointing-trainer": checkpointing_trainer,
    "ignores-sigterm": ignores_sigterm,
    "hostile-command-line": hostile_command_line,
    "slow-leak": slow_leak,
    "idle-holder": idle_holder,
}


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != LABEL]
    if not args or args[0] not in ROLES:
        print(f"usage: python -m gpuadmin.demo.programs {{{','.join(ROLES)}}} ARG...", file=sys.stderr)
        return 2
    try:
        ROLES[args[0]](*args[1:])
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

