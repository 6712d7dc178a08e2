"""The executor is a plain library: loading it must not pull in Django or Celery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_kill_executor_imports_neither_django_nor_celery() -> None:
    check = (
        "import sys; import gpuadmin.probe.kill, gpuadmin.probe.journal; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'celery', 'kombu'}); "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", check],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
