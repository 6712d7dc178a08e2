"""CPU per snapshot of each way through ``parse_snapshot``: what a validation mechanism is worth.

Ingest's side-by-side benchmarks (``ingest_instructions.py``) send current, valid snapshots only,
which msgspec's quick check (``validation.quick_snapshot_decoder``) accepts: a mechanism used only
when it refuses never runs there. This measures the four ways of one 200-process synthetic snapshot:
the current version valid, schema version 1 valid (an older agent), and two refusals (a late field,
an early one). Each is the least CPU of ``--repeats`` runs of 5 parses.

    python benchmarks/validation_paths.py [--tree PATH] [--repeats 7]

``--tree``: another checkout (e.g. ``git worktree add /tmp/without-x HEAD`` with a mechanism taken
out), whose ``gpuadmin`` is the one measured; this tree's by default.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose gpuadmin is measured")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.tree.resolve()))
    sys.path.insert(1, str(REPO))
    from benchmarks.django_bench import setup_django, throwaway_data_dir

    with throwaway_data_dir("validation-paths-", wait=False) as data_dir:
        setup_django()
        from gpuadmin.fleet.intake.validation import SnapshotRejected, parse_snapshot

        try:
            from gpuadmin.fleet import synthetic
        except ImportError:  # a tree older than it
            from gpuadmin.fleet import demo as synthetic  # type: ignore[no-redef]
        current = synthetic.demo_hosts(Path(data_dir), 1, processes=200)[0].document(1)
        older = json.loads(json.dumps(current))
        older["schema_version"] = 1
        for process in older["processes"]:
            process.pop("owner", None)
        late = json.loads(json.dumps(current))
        late["processes"][150]["pid"] = 1.5
        early = json.loads(json.dumps(current))
        early["host"]["name"] = 7
        print(f"tree: {args.tree}")
        for label, document in [("valid, current version", current), ("valid, schema version 1", older),
                                ("refused: processes[150].pid 1.5", late), ("refused: host.name 7", early)]:
            text = json.dumps(document)

            def parse(text: str = text) -> str:
                try:
                    parse_snapshot(text)
                except SnapshotRejected as rejected:
                    return f"refused ({rejected.message[:40]})"
                return "accepted"

            outcome = parse()
            runs = []
            for _ in range(args.repeats):
                started = time.process_time()
                for _ in range(5):
                    parse()
                runs.append((time.process_time() - started) / 5)
            print(f"{label:34} {1000 * min(runs):7.2f} ms CPU  {outcome}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
