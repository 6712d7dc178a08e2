"""python -m gpuadmin.probe --json: print one snapshot of this host.

Options default to the agent's environment (GPUADMIN_GPU_BACKEND,
GPUADMIN_SIMULATED_GPUS, GPUADMIN_DEVICE_GLOB, GPUADMIN_HOST_NAME).
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuadmin.probe.config import GPU_BACKENDS, ProbeConfig, ProbeConfigError
from gpuadmin.probe.snapshot import take_snapshot


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpuadmin.probe", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", required=True,
                        help="print the snapshot as JSON (the only output format)")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON for people")
    parser.add_argument("--all", action="store_true", dest="include_all",
                        help="every process, not only those that matter")
    parser.add_argument("--gpu-backend", choices=GPU_BACKENDS, help="default: $GPUADMIN_GPU_BACKEND or auto")
    parser.add_argument("--simulated-gpus", metavar="FILE", help="default: $GPUADMIN_SIMULATED_GPUS")
    parser.add_argument("--device-glob", metavar="GLOB",
                        help="default: $GPUADMIN_DEVICE_GLOB or /dev/nvidia*")
    parser.add_argument("--host-name", metavar="NAME", help="default: $GPUADMIN_HOST_NAME or the hostname")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = ProbeConfig.from_env(
            gpu_backend=args.gpu_backend,
            simulated_gpus_path=args.simulated_gpus,
            device_glob=args.device_glob,
            host_name=args.host_name,
            include_all=args.include_all or None,
        )
    except ProbeConfigError as exc:
        print(f"gpuadmin.probe: {exc}", file=sys.stderr)
        return 2
    document = take_snapshot(config)
    text = json.dumps(document, indent=2) if args.pretty else json.dumps(document, separators=(",", ":"))
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
