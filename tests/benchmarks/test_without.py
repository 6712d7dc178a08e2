"""benchmarks/without/: each patch takes one performance mechanism out, for a side-by-side run against a
worktree without it (benchmarks/README.md, "What each performance mechanism is worth"). A patch that no
longer applies would leave that row's command unrunnable: this says so as soon as the code moves."""

from __future__ import annotations

import subprocess

import pytest

from tests.run.helpers import REPO

PATCHES = sorted((REPO / "benchmarks" / "without").glob("*.patch"))


def test_there_is_a_patch_to_check() -> None:
    assert PATCHES, "benchmarks/without/ holds no patch"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda path: path.stem)
def test_each_patch_still_applies_to_this_tree(patch) -> None:
    checked = subprocess.run(["git", "apply", "--check", str(patch)], cwd=REPO, capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, f"{patch.name} no longer applies: {checked.stderr}"
