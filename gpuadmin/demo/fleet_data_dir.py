"""Which data directory `manage.py demo_fleet` writes to, chosen before Django reads its settings.

The README suggests `manage.py demo_fleet --hosts 200 --follow` beside `make demo`, whose data
directory is var/demo/ (``scenario.DEMO_DATA_DIR``), not the default var/: run as it is, the command
would write to another database, or fail with a traceback when var/ was never made. So, with
GPUADMIN_DATA_DIR unset: the demo's directory when it holds a database, else the default when it
exists; else a sentence saying what to run or set. No Django here: settings are not loaded yet.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path

from gpuadmin.data_dir import SQLITE_DATABASE, data_dir
from gpuadmin.demo.scenario import DEMO_DATA_DIR

VARIABLE = "GPUADMIN_DATA_DIR"


class NoDataDir(Exception):
    """Neither the demo's data directory nor the default one exists; the message says what to do."""


def choose(environ: MutableMapping[str, str], demo_dir: Path = DEMO_DATA_DIR,
           default_dir: Path | None = None) -> str | None:
    """Set GPUADMIN_DATA_DIR in ``environ`` to the demo's when it is unset and the demo has a database;
    return a line saying which directory was chosen (None: the one already named, or PostgreSQL's).

    Raises NoDataDir when there is none to write to."""
    if environ.get(VARIABLE) or environ.get("DATABASE_URL"):
        return None
    if (demo_dir / SQLITE_DATABASE).is_file():
        environ[VARIABLE] = str(demo_dir)
        return (f"demo_fleet: writing to the demo's data directory {demo_dir} "
                f"(set {VARIABLE} to write to another)")
    default = default_dir or data_dir()
    if (default / SQLITE_DATABASE).is_file():
        return None
    raise NoDataDir(
        f"demo_fleet: no data directory with a database: start `make demo` (it makes {demo_dir}) or "
        f"`make run` (it makes {default}) first, or set {VARIABLE} to the data directory of the running "
        "panel"
    )
