"""`make demo` (``python -m gpuadmin.run --demo``): real processes on simulated GPUs, a few synthetic
hosts and two demo accounts, so everything gpuadmin is for shows within a minute (docs/demo.md)."""
