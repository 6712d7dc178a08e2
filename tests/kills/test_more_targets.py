"""One request for several unrelated processes ("one kill for all the orphans"), and the reap plan."""

from __future__ import annotations

import pytest

from gpuadmin.kills import plans, services
from gpuadmin.kills.services.errors import BadInput
from tests.factories import GiB

pytestmark = pytest.mark.django_db


def test_targets_named_beside_the_first_join_it_under_the_same_rules(lab, requester):
    kill_request = services.file_request(
        requester, host="gpu01", pid=4600, start_time_ticks=460000, reason="orphans of a dead launcher",
        also=[(4121, 412100), (4400, 440000), (4122, 412200), (4123, 1)],
    )
    targets = {t.pid: t for t in kill_request.targets.all()}
    assert sorted(targets) == [4121, 4600]
    assert not any(t.is_descendant for t in targets.values())  # named, not found below the first
    assert kill_request.memory_expected_release_bytes == 7 * GiB
    excluded = {e["pid"]: e["why"] for e in kill_request.excluded_targets}
    assert set(excluded) == {4400, 4122, 4123}
    assert "protected" in excluded[4400]
    assert "zombie" in excluded[4122] and "PID 4120" in excluded[4122]
    assert "PID was reused" in excluded[4123]


def test_the_reap_plan_is_one_sigchld_and_files_like_any_other(lab, requester):
    kill_request = services.file_request(
        requester, host="gpu01", pid=4199, start_time_ticks=419900, reason="three zombies",
        plan=plans.preset(plans.REAP_PLAN_NAME),
    )
    assert kill_request.plan == [{"signal": "SIGCHLD", "grace_seconds": 5}]
    assert plans.asks_to_reap(kill_request.plan)
    with pytest.raises(BadInput, match="only step"):
        services.file_request(
            requester, host="gpu01", pid=4199, start_time_ticks=419900, reason="x",
            plan=[{"signal": "SIGCHLD", "grace_seconds": 5}, {"signal": "SIGKILL", "grace_seconds": 5}],
        )
