"""benchmarks/gpu_check.py beyond its smoke run: no GPU, no Django, and a failed expectation fails it.

The smoke run (test_smoke.py) runs every scenario on the simulated GPU under the harness;
these run it plainly, each in a subprocess (the script becomes a child subreaper).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.benchmarks.test_smoke import BENCHMARKS, script_env
from tests.run.helpers import REPO

SCRIPT = BENCHMARKS / "gpu_check.py"
TIMEOUT_SECONDS = 120


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env or script_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)


def test_the_default_backend_without_a_gpu_says_so_and_exits_0(tmp_path: Path) -> None:
    env = script_env() | {"PATH": str(tmp_path)}  # no nvidia-smi on it, whatever this host has
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_SECONDS, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No GPU check here (nvidia-smi is not installed)" in done.stdout
    assert "--backend simulated" in done.stdout


BLOCK_DJANGO = (
    "import runpy, sys\n"
    "sys.modules['django'] = sys.modules['celery'] = None  # importing either now raises ImportError\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def test_it_runs_from_a_source_copy_without_django() -> None:
    done = run_python(BLOCK_DJANGO, str(SCRIPT), "--backend", "simulated", "--holders-mib", "8",
                      "--grace-seconds", "3", "--only", "torchrun-rank", "--only", "leader-exited")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" PASS") == 2, done.stdout


WRONG_EXPECTATIONS = (
    "import dataclasses, sys\n"
    f"sys.path.insert(0, {str(REPO)!r})\n"
    "from benchmarks import gpu_check\n"
    "first = gpu_check.SCENARIOS[0]\n"
    "gpu_check.SCENARIOS[:] = [dataclasses.replace(first, orphaned=False),\n"
    "                          dataclasses.replace(first, exits_on='SIGKILL'), first]\n"
    "sys.argv = ['gpu_check.py', '--backend', 'simulated', '--holders-mib', '8', '--grace-seconds', '2']\n"
    "sys.exit(gpu_check.main())\n"
)


def test_an_expectation_that_fails_fails_the_script() -> None:
    done = run_python(WRONG_EXPECTATIONS)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("setsid-launcher")]
    assert len(lines) == 3, done.stdout
    assert "orphaned yes/yes (expected no/no)" in lines[0] and "FAIL: the probe's orphaned" in lines[0]
    assert "FAIL: expected every holder to exit on SIGKILL" in lines[1]
    assert lines[2].endswith("PASS")
    assert "2 scenario(s) failed" in done.stdout
