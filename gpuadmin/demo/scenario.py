"""`make demo`: what ``python -m gpuadmin.run --demo`` adds to `make run` (docs/demo.md).

The demo host is this box, with four simulated GPUs whose memory is held by
real processes the supervisor starts (``programs.py``); ``driver.py`` keeps
the simulated GPU file and sends the synthetic hosts' snapshots
(``fleet.py``). Every scenario process is a child of the supervisor, in its
own session, so Ctrl+C ends them all and nothing outlives the demo.
"""

from __future__ import annotations

import io
import os
import secrets
import signal
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from gpuadmin.data_dir import BASE_DIR
from gpuadmin.demo import claims
from gpuadmin.demo.claims import GiB
from gpuadmin.demo.programs import HOSTILE_ARGUMENTS, command

DEMO_DATA_DIR = BASE_DIR / "var" / "demo"  # apart from `make run`'s var/: demo accounts stay in the demo
# Quicker than production, so every finding shows within a minute.
DEMO_SETTINGS = {
    "GPUADMIN_PROBE_INTERVAL": "5",
    "GPUADMIN_LEAK_RISING_SAMPLES": "4",
    "GPUADMIN_IDLE_HOLDER_SECONDS": "20",
}
REQUESTER = "demo-requester"
APPROVER = "demo-approver"

GPUS: list[dict[str, Any]] = [
    {"uuid": "GPU-demo-0", "name": "Simulated H100 (demo)", "memory_total_bytes": 80 * GiB,
     "utilization_percent": 55, "utilization_wave_percent": 40, "period_seconds": 300},
    {"uuid": "GPU-demo-1", "name": "Simulated H100 (demo)", "memory_total_bytes": 80 * GiB,
     "utilization_percent": 45, "utilization_wave_percent": 50, "period_seconds": 420},
    # Memory no process accounts for (as a stuck driver context shows): the unattributed finding.
    {"uuid": "GPU-demo-2", "name": "Simulated H100 (demo)", "memory_total_bytes": 80 * GiB,
     "extra_used_bytes": 7 * GiB, "utilization_percent": 3},
    # Held at 0% utilization: the idle holder finding.
    {"uuid": "GPU-demo-3", "name": "Simulated H100 (demo)", "memory_total_bytes": 80 * GiB,
     "utilization_percent": 0},
]


@dataclass(frozen=True)
class Scenario:
    """One story the demo tells: the supervisor child that plays it, and what the host page shows."""

    name: str
    role: str
    args: tuple[str, ...] = ()
    stop_signal: int = signal.SIGTERM


SCENARIOS = (
    Scenario("DDP launcher, 4 ranks on GPUs 0 and 1", "ddp-launcher", ("GPU-demo-0,GPU-demo-1",)),
    Scenario("launcher killed, 2 orphaned workers on GPU 2", "crashing-launcher", ("GPU-demo-2",)),
    Scenario("parent that leaks zombies", "zombie-parent"),
    Scenario("trainer that checkpoints on SIGINT", "checkpointing-trainer", ("GPU-demo-0",),
             stop_signal=signal.SIGINT),
    # Ctrl+C must not wait out the grace period for it.
    Scenario("process that ignores SIGTERM", "ignores-sigterm", ("GPU-demo-1",), stop_signal=signal.SIGKILL),
    Scenario("hostile command line", "hostile-command-line", ("GPU-demo-2", *HOSTILE_ARGUMENTS)),
    Scenario("slow leak", "slow-leak", ("GPU-demo-1",)),
    Scenario("idle holder on GPU 3", "idle-holder", ("GPU-demo-3",)),
)


def configure(environ: MutableMapping[str, str]) -> None:
    """The demo's environment, before anything reads the settings: simulated GPUs only, quick findings."""
    environ.setdefault("GPUADMIN_DATA_DIR", str(DEMO_DATA_DIR))
    environ["GPUADMIN_GPU_BACKEND"] = "simulated"  # never this box's real GPUs
    for name, value in DEMO_SETTINGS.items():
        environ.setdefault(name, value)
    environ["GPUADMIN_SIMULATED_GPUS"] = str(claims.gpu_file())


def prepare_files() -> None:
    """Once the data directory exists: no claims from a previous run, the GPU file for the first snapshot."""
    claims.prepare()
    claims.write_gpu_file(GPUS)


def prepare() -> list[str]:
    """Demo accounts and synthetic hosts (Django set up); returns the lines to print."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from gpuadmin.accounts.roles import Role
    from gpuadmin.demo import fleet

    fleet.enrol_all()
    lines = []
    user_model = get_user_model()
    for name, roles in ((REQUESTER, [Role.REQUESTER]), (APPROVER, [Role.APPROVER])):
        password = secrets.token_urlsafe(12)  # new at each start: printed below, never stored in clear
        os.environ["GPUADMIN_DEMO_PASSWORD"] = password
        exists = user_model.objects.filter(username=name).exists()
        call_command("createuser", name, role=[str(r) for r in roles], update=exists,
                     password_env="GPUADMIN_DEMO_PASSWORD", stdout=io.StringIO())  # noqa: S106 (a name)
        lines.append(f"  {name:<15} password {password}   ({', '.join(str(r) for r in roles)})")
    del os.environ["GPUADMIN_DEMO_PASSWORD"]
    return lines


def children() -> list[Any]:
    """The supervisor's children that play the scenario, and the driver."""
    from gpuadmin.run import Child

    played = [Child(f"demo: {s.name}", command(s.role, *s.args), stop_signal=s.stop_signal, restart=False)
              for s in SCENARIOS]
    driver = Child("demo: driver (simulated GPU file, synthetic hosts)",
                   [sys.executable, "-m", "gpuadmin.demo.driver"])
    return [driver, *played]
