"""`make demo`: what ``python -m gpuadmin.demo`` adds to `make run` (docs/demo.md).

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
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from gpuadmin.data_dir import BASE_DIR
from gpuadmin.demo import claims
from gpuadmin.demo.claims import GiB
from gpuadmin.demo.programs import HOSTILE_ARGUMENTS, command
from gpuadmin.run import Child
from gpuadmin.wire.timestamps import wire_time

DEMO_DATA_DIR = BASE_DIR / "var" / "demo"  # apart from `make run`'s var/: demo accounts stay in the demo
# Quicker than production, so every finding shows within a minute.
DEMO_SETTINGS = {
    "GPUADMIN_PROBE_INTERVAL": "5",
    "GPUADMIN_LEAK_RISING_SAMPLES": "4",
    "GPUADMIN_IDLE_HOLDER_SECONDS": "20",
    "GPUADMIN_USAGE_FLUSH_SECONDS": "60",  # the usage page current within a minute
}
REQUESTER = "demo-requester"
APPROVER = "demo-approver"

# When the demo's XIDs happened: fixed for the run, so their findings read the same at every snapshot.
_XID_SEEN_AT = wire_time(time.time(), timespec="seconds")


def _health(**fields: Any) -> dict[str, Any]:
    """A demo GPU's health (docs/snapshot.md): a healthy H100's figures, with ``fields`` over them."""
    healthy: dict[str, Any] = {
        "temperature_celsius": 64, "power_draw_milliwatts": 412_000, "power_limit_milliwatts": 700_000,
        "clock_event_reasons": [], "ecc_volatile_corrected_errors": 0, "ecc_volatile_uncorrected_errors": 0,
        "ecc_aggregate_corrected_errors": 12, "ecc_aggregate_uncorrected_errors": 0,
        "remapped_rows_correctable": 0, "remapped_rows_uncorrectable": 0, "remapped_rows_pending": False,
        "remapped_rows_failed": False, "xid_errors": [],
    }
    return {**healthy, **fields}


def _xids(*numbers: int) -> list[dict[str, Any]]:
    return [{"xid": n, "count": 1, "last_seen_at": _XID_SEEN_AT} for n in numbers]


# Between them, the GPUs show every health finding (docs/demo.md).
GPUS: list[dict[str, Any]] = [
    # Too hot: thermal throttling.
    {"uuid": "GPU-demo-0", "name": "Simulated H100 (demo)", "memory_total_bytes": 80 * GiB,
     "utilization_percent": 55, "utilization_wave_percent": 40, "period_seconds": 300,
     "health": _health(temperature_celsius=91, power_draw_milliwatts=655_000,
                       clock_event_reasons=["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"])},
    # A contained ECC error: uncorrectable errors, a row remap pending a reset, XIDs 94 and 63.
    {"uuid": "GPU-demo-1", "name": "Simulated H100 (demo)", "memory_total_bytes": 80 * GiB,
     "utilization_percent": 45, "utilization_wave_percent": 50, "period_seconds": 420,
     "health": _health(ecc_volatile_uncorrected_errors=1, ecc_aggregate_uncorrected_errors=1,
                       remapped_rows_uncorrectable=1, remapped_rows_pending=True, xid_errors=_xids(63, 94))},
    # Memory no process accounts for (as a stuck driver context shows): the unattributed finding;
    # and a GPU past saving: row remapping failed, XIDs 48, 64 and 95.
    {"uuid": "GPU-demo-2", "name": "Simulated H100 (demo)", "memory_total_bytes": 80 * GiB,
     "extra_used_bytes": 7 * GiB, "utilization_percent": 3,
     "health": _health(remapped_rows_uncorrectable=512, remapped_rows_failed=True,
                       xid_errors=_xids(48, 64, 95))},
    # Held at 0% utilization: the idle holder finding; an older GPU (pages retired, no row remapping)
    # behind a power brake, and fallen off the bus (XID 79).
    {"uuid": "GPU-demo-3", "name": "Simulated V100 (demo)", "memory_total_bytes": 32 * GiB,
     "utilization_percent": 0,
     "health": _health(power_draw_milliwatts=301_000, power_limit_milliwatts=300_000,
                       clock_event_reasons=["hw_slowdown", "hw_power_brake_slowdown"],
                       remapped_rows_correctable=None, remapped_rows_uncorrectable=None,
                       remapped_rows_pending=None, remapped_rows_failed=None,
                       retired_pages_single_bit_ecc=3, retired_pages_double_bit_ecc=1,
                       retired_pages_pending=True, xid_errors=_xids(79))},
]
# Every GPU health condition the GPUs above show: tests/demo checks they all open a finding.
HEALTH_CONDITIONS = frozenset({
    "thermal_throttling", "power_throttling", "uncorrectable_ecc", "row_remapping_pending",
    "row_remapping_failed", "page_retirement_pending",
    "xid_48", "xid_63", "xid_64", "xid_79", "xid_94", "xid_95",
})


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


def children() -> list[Child]:
    """The supervisor's children that play the scenario, and the driver."""
    played = [Child(f"demo: {s.name}", command(s.role, *s.args), stop_signal=s.stop_signal, restart=False)
              for s in SCENARIOS]
    driver = Child("demo: driver (simulated GPU file, synthetic hosts)",
                   [sys.executable, "-m", "gpuadmin.demo.driver"])
    return [driver, *played]


def ready_message(url: str, host_name: str, lines: list[str]) -> str:
    """What the supervisor prints once everything answers."""
    return "\n".join([
        f"gpuadmin demo is running at {url}; every GPU and process of host {host_name} is simulated",
        f"  the scenario: {url}hosts/{host_name}/   (admin account: see above)",
        "  demo accounts, new passwords at each start:", *lines,
        "press Ctrl+C to stop (every demo process ends with it)",
    ])
