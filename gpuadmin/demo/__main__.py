"""`make demo`: `make run`'s supervisor with the demo's scenario (``python -m gpuadmin.demo``).

The demo builds its children and calls the supervisor; the supervisor knows
nothing of the demo (``python -m gpuadmin.run --demo`` hands over to this).
"""

from __future__ import annotations

import sys

from gpuadmin.demo import scenario
from gpuadmin.run import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], scenario=scenario))
