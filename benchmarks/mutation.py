"""Mutation testing of the safety-critical modules, with mutmut: do the tests notice a broken check?

    .venv/bin/python benchmarks/mutation.py                 # every group below
    .venv/bin/python benchmarks/mutation.py identity chain  # some groups
    .venv/bin/python benchmarks/mutation.py --list          # the groups, their modules and tests

mutmut changes one thing at a time in a module (a comparison, a constant, a
boolean, a returned value) and runs the tests that reach the changed function;
a mutant the tests do not fail on "survived". Each group pairs the modules with
the test files that are meant to guard them, so a mutant runs a few seconds of
tests, not the whole suite (benchmarks/README.md has the score and what each
survivor means). Not part of `make test`: a full run takes tens of minutes.

Each group runs in its own copy of the working tree (mutmut writes a mutants/
folder and its own configuration), under a temporary folder, or --workdir.
The copy's mutants/ folder is put first on PYTHONPATH so that processes the
tests start (the probe CLI, test programs) import the mutated code too.
Results go to --out (a JSON file) and, per surviving mutant, its diff.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import processes  # noqa: E402


@dataclass(frozen=True)
class Group:
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    # Tests that run the module in a forked child (the executor as another user, an agent
    # killed mid-way): mutmut's tracing sees only the test process, so it would never pick
    # them for a mutant. They run with every mutant instead.
    forked_tests: tuple[str, ...] = ()


def _kill_tests(*names: str) -> tuple[str, ...]:
    """Tests under tests/probe/kill (all of them when no names are given)."""
    base = "tests/probe/kill"
    return tuple(f"{base}/{name}" for name in names) if names else (base,)


GROUPS: dict[str, Group] = {
    "identity": Group(("gpuadmin/probe/kill/identity.py",), _kill_tests()),
    "order": Group(
        ("gpuadmin/wire/kill_order.py",),
        (
            *_kill_tests(
                "test_order_validation.py", "test_order_edges.py", "test_signed_orders.py", "test_reset.py"
            ),
            "tests/wire/test_kill_order.py",
        ),
    ),
    "protocol": Group(
        ("gpuadmin/wire/kill_protocol.py",),
        (
            *_kill_tests("test_protocol.py", "test_protocol_records.py"),
            "tests/kills/test_protocol_choices.py",
            "tests/kills/test_progress.py",
        ),
    ),
    "executor": Group(
        ("gpuadmin/probe/kill/executor.py",),
        _kill_tests(),
        forked_tests=(
            *_kill_tests("test_refusals.py::test_a_target_the_agent_may_not_signal_fails_with_eperm"),
            *_kill_tests(
                "test_deadline_and_repeats.py::"
                "test_a_repeat_of_an_order_whose_agent_died_mid_way_is_interrupted_and_runs_nothing"
            ),
        ),
    ),
    "states": Group(("gpuadmin/kills/states.py",), ("tests/kills/test_states.py",)),
    "decisions": Group(
        ("gpuadmin/kills/services/decisions.py",),
        (
            "tests/kills/test_decisions.py",
            "tests/kills/test_decision_records.py",
            "tests/kills/test_requesting.py",
            "tests/kills/test_pages.py",  # may_decide / may_cancel decide the buttons
            "tests/accounts/test_credential_changes.py",  # the two-person hold, at the approval's moment
        ),
    ),
    "chain": Group(
        ("gpuadmin/audit/chain.py",), ("tests/audit/test_chain.py", "tests/audit/test_chain_rows.py")
    ),
    "validation": Group(
        ("gpuadmin/fleet/intake/validation.py",),
        (
            "tests/fleet/intake/test_validation.py",
            "tests/fleet/intake/test_validation_edges.py",
            "tests/fleet/intake/test_schema_types.py",
        ),
    ),
}

# What the copy leaves out: environments, caches, local data, other runs' output.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "var", "mutants", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
    "*.egg-info", ".coverage*", "htmlcov",
)
STATUS_LINE = re.compile(r"^\s*(\S+): (\w[\w ]*)$")


def mutmut_config(group: Group, timeout_multiplier: float) -> str:
    def toml_list(items: tuple[str, ...] | list[str]) -> str:
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["gpuadmin/"]\n'
        f"only_mutate = {toml_list(group.modules)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(group.tests)}\n"
        f"pytest_add_cli_args = {toml_list(group.forked_tests)}\n"
        # Settings find templates and static files beside the package.
        'also_copy = ["templates/", "static/", "manage.py"]\n'
        # A mutant that turns a wait into a hang is a kill (timeout), and need not wait 15x long.
        f"timeout_multiplier = {timeout_multiplier}\n"
    )


def run_group(
    name: str, group: Group, workdir: Path, *, max_children: int, timeout_multiplier: float,
    only: list[str] | None = None,
) -> dict:
    """Mutate the group's modules and run its tests on each mutant (only the mutants named in
    ``only``, when given), in a fresh copy of the tree; the counts and each mutant not killed."""
    copy = workdir / name
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(ROOT, copy, ignore=IGNORED)
    with (copy / "pyproject.toml").open("a", encoding="utf-8") as pyproject:
        pyproject.write(mutmut_config(group, timeout_multiplier))
    # Made now, not by mutmut: a folder on PYTHONPATH that is missing when Python starts is
    # remembered as having no modules, and the tests could not import the mutated package.
    (copy / "mutants").mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(copy / "mutants"), env.get("PYTHONPATH")]))
    env.pop("COVERAGE_PROCESS_START", None)
    log = copy / "mutmut.log"
    started = time.monotonic()
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *(only or [])],
            cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
        )
    seconds = time.monotonic() - started
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=copy, env=env, capture_output=True, text=True, check=False,
    ).stdout
    statuses: dict[str, str] = {}
    for line in listing.splitlines():
        if (match := STATUS_LINE.match(line)) and (only is None or match.group(1) in only):
            statuses[match.group(1)] = match.group(2)
    if not statuses or set(statuses.values()) == {"not checked"}:
        # mutmut stopped before testing any mutant: usually the tests failed without mutants.
        print(f"   mutmut tested no mutant of {name}; see {log}", flush=True)
        statuses = {}
    survivors = {}
    for mutant, status in statuses.items():
        # "not checked": the run was stopped before it came to that mutant.
        if status not in {"killed", "timeout", "caught by type check", "not checked"}:
            survivors[mutant] = subprocess.run(
                [sys.executable, "-m", "mutmut", "show", mutant],
                cwd=copy, env=env, capture_output=True, text=True, check=False,
            ).stdout
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    return {
        "modules": list(group.modules),
        "tests": list(group.tests),
        "seconds": round(seconds),
        "counts": counts,
        "score": score(counts),
        "not_killed": survivors,
        "log": str(log),
    }


def retest(before: dict, again: dict) -> dict:
    """The earlier run's result with the verdicts of its retested mutants replaced."""
    counts = dict(before["counts"])
    for shown in before["not_killed"].values():
        status = shown.splitlines()[0].rsplit(": ", 1)[-1] if shown else "survived"
        counts[status] -= 1
    for status, count in again["counts"].items():
        counts[status] = counts.get(status, 0) + count
    counts = {status: count for status, count in counts.items() if count}
    seconds = before["seconds"] + again["seconds"]
    retested = sum(again["counts"].values())
    return {**again, "counts": counts, "score": score(counts), "seconds": seconds, "retested": retested}


def score(counts: dict[str, int]) -> float | None:
    """mutmut's score: killed (a test failed, or the mutant hung) over all mutants the tests reached
    (neither "no tests" nor "not checked", left by a run stopped early, count)."""
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    reached = killed + counts.get("survived", 0) + counts.get("suspicious", 0)
    return round(100 * killed / reached, 1) if reached else None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("groups", nargs="*", help=f"groups to run (default: all): {', '.join(GROUPS)}")
    parser.add_argument("--list", action="store_true", help="print the groups and exit")
    parser.add_argument("--workdir", type=Path, help="where the copies go (default: a new temporary folder)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/mutation.json", help="results (JSON)"
    )
    parser.add_argument("--max-children", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout-multiplier", type=float, default=4.0)
    parser.add_argument(
        "--retest", action="store_true",
        help="run only the mutants that --out says were not killed (after adding tests); "
        "the others keep their verdict",
    )
    args = parser.parse_args()
    processes.guard()
    if args.list:
        for name, group in GROUPS.items():
            print(f"{name}: {' '.join(group.modules)}\n    tests: {' '.join(group.tests)}")
        return 0
    unknown = [name for name in args.groups if name not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpuadmin-mutation-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = {}
    if args.out.exists():  # runs of other groups stay in the file
        results = json.loads(args.out.read_text())
    for name in args.groups or GROUPS:
        print(f"== {name}: mutating {' '.join(GROUPS[name].modules)} (copy in {workdir / name})", flush=True)
        if args.retest and name in results:
            result = retest(results[name], run_group(
                name, GROUPS[name], workdir, max_children=args.max_children,
                timeout_multiplier=args.timeout_multiplier, only=sorted(results[name]["not_killed"]),
            ))
        else:
            result = run_group(
                name, GROUPS[name], workdir, max_children=args.max_children,
                timeout_multiplier=args.timeout_multiplier,
            )
        results[name] = result
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True))
        print(f"   {result['counts']}  score {result['score']}%  in {result['seconds']} s", flush=True)
        for mutant in result["not_killed"]:
            print(f"   not killed: {mutant}", flush=True)
    total: dict[str, int] = {}
    for result in results.values():
        for status, count in result["counts"].items():
            total[status] = total.get(status, 0) + count
    print(f"== all groups in {args.out}: {total}  score {score(total)}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
