"""Take the host page's and a finished kill's screenshots for the README:
`.venv/bin/python docs/screenshots/take_pages.py`.

Runs tests/browser/test_every_page.py (every page at 390 and 1440 px, axe and no sideways scroll) with
GPUADMIN_PAGE_SCREENSHOTS pointing here, so the pictures are the first screen of exactly the pages that
test checks (host-1440.png, host-390.png, kill-1440.png, kill-390.png), then shrinks each below
take.py's MAX_BYTES with take.py's own PNG writer (one way to shrink, no image package needed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NAMES = ("host-1440.png", "host-390.png", "kill-1440.png", "kill-390.png")


def _take() -> object:
    spec = importlib.util.spec_from_file_location("screenshots_take", HERE / "take.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    take = _take()
    test = ROOT / "tests" / "browser" / "test_every_page.py"
    environ = {**os.environ, "GPUADMIN_PAGE_SCREENSHOTS": str(HERE)}
    run = subprocess.run([sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:randomly", "-n", "0",
                          "-k", "every_page"], cwd=ROOT, env=environ, check=False)
    if run.returncode:
        return run.returncode
    for name in NAMES:
        path = HERE / name
        take.write_small(path, *take.read_rgb(path))  # type: ignore[attr-defined]
        size = path.stat().st_size
        print(f"{path.relative_to(ROOT)}: {size // 1024} KiB")
        if size > take.MAX_BYTES:  # type: ignore[attr-defined]
            print(f"{name} is over {take.MAX_BYTES // 1024} KiB", file=sys.stderr)  # type: ignore[attr-defined]
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
