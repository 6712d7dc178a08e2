"""The settings mypy's Django plugin loads (``[tool.django-stubs]`` in pyproject.toml).

gpuadmin's own settings, read with a throwaway data directory under ``build/``
when the environment names none: settings only read a prepared directory, and
type checking a fresh clone (``.venv/bin/python -m mypy``) must need no
``make run`` first and touch no ``var/``.
"""

import os

from gpuadmin import data_dir

if "GPUADMIN_DATA_DIR" not in os.environ:
    os.environ["GPUADMIN_DATA_DIR"] = str(data_dir.BASE_DIR / "build" / "mypy-data")
    data_dir.prepare_data_dir(central=False)

from gpuadmin.settings import *  # noqa: F403
