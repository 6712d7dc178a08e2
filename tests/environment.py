"""Loaded by pytest before pytest-django reads the settings (`-p tests.environment` in pyproject).

tests/conftest.py is too late for this: pytest-django loads gpuadmin.settings
while pytest is still reading its options, before any conftest is imported.
Every test run gets its own GPUADMIN_DATA_DIR (secret key, SQLite files, the
filesystem broker), prepared as `make run` prepares var/, so tests never touch
the repository's var/ or a running panel's data. REDIS_URL is dropped for the
same reason: tests that need Redis start their own. Agents (in process, and the
workers tests start) pin the run's central key through GPUADMIN_CENTRAL_PUBLIC_KEY.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from gpuadmin.data_dir import CENTRAL_SIGNING_KEY, prepare_data_dir
from gpuadmin.wire.signing import load_private_key, public_key_text

__all__ = ["without_coverage"]



def without_coverage() -> dict[str, str]:
    """The environment for a process a test starts that runs no gpuadmin code (a kill's
    target, a probe workload): without coverage's variables, so that `make test`'s coverage,
    which starts in every Python subprocess, does not cost it a few hundred ms for nothing."""
    return {name: value for name, value in os.environ.items() if not name.startswith("COVERAGE_")}


DATA_DIR = tempfile.mkdtemp(prefix="gpuadmin-test-data-")
os.environ["GPUADMIN_DATA_DIR"] = DATA_DIR
os.environ.pop("REDIS_URL", None)
# Django's live server serves static files from the finders, which know no hashed names
# (settings.STORAGES); tests/test_static_files.py runs collectstatic and checks the hashed ones.
os.environ["GPUADMIN_STATIC_HASHED"] = "0"
atexit.register(shutil.rmtree, DATA_DIR, True)
prepare_data_dir(Path(DATA_DIR))
CENTRAL_KEY = load_private_key(Path(DATA_DIR) / CENTRAL_SIGNING_KEY)
os.environ["GPUADMIN_CENTRAL_PUBLIC_KEY"] = public_key_text(CENTRAL_KEY)
