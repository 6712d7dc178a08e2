"""Which processes a request may name: every refusal rule, with its reason shown."""

from __future__ import annotations

import pytest

from gpuadmin.kills.targets import resolve
from tests.factories import proc
from tests.kills.helpers import lab_snapshot


def preview(pid: int, start: int | None = None, **kwargs):
    return resolve(lab_snapshot(), pid, pid * 100 if start is None else start, **kwargs)


def test_a_plain_gpu_process_is_a_target():
    result = preview(4600)
    assert result.ok
    assert [t.pid for t in result.targets] == [4600]
    assert result.refusal is None and result.warnings == []


def test_pid_1_is_refused():
    result = preview(1)
    assert not result.ok
    assert "PID 1" in result.refusal and "init" in result.refusal


def test_kernel_thread_is_refused():
    result = preview(2)
    assert result.refusal == "it is a kernel thread"


def test_the_agent_itself_is_refused():
    assert preview(4242).refusal == "it is the gpuadmin agent itself"


def test_an_ancestor_of_the_agent_is_refused():
    assert "ancestor of the gpuadmin agent" in preview(4240).refusal


def test_a_protected_user_is_refused():
    assert preview(4400).refusal == "user 'postgres' is protected (GPUADMIN_PROTECTED_USERS)"


def test_a_protected_uid_is_refused(settings):
    settings.GPUADMIN_PROTECTED_UIDS = [1002]
    assert preview(4600).refusal == "uid 1002 is protected (GPUADMIN_PROTECTED_UIDS)"


def test_a_protected_command_pattern_is_refused():
    assert "matches the protected pattern '^sshd\\\\b'" in preview(4500).refusal


def test_a_broken_protection_pattern_refuses_rather_than_lets_through(settings):
    settings.GPUADMIN_PROTECTED_COMMAND_PATTERNS = ["(unclosed"]
    assert "not a valid regular expression" in preview(4600).refusal


def test_a_pid_not_in_the_snapshot_is_refused_with_the_snapshot_time():
    result = preview(31337)
    assert result.refusal.startswith("PID 31337 is not in the latest snapshot (taken at ")


def test_a_reused_pid_with_another_start_time_is_refused():
    result = preview(4600, start=1)
    assert "different process" in result.refusal
    assert result.targets == []


def test_a_zombie_is_refused_and_its_parent_offered():
    result = preview(4200)
    assert not result.ok
    assert "zombie" in result.refusal and "only its parent" in result.refusal
    offer = result.parent_offer
    assert offer.pid == 4199
    assert offer.name == "supervisor" and offer.user == "svc"
    assert offer.command_line == "supervisord -n"
    assert offer.zombie_count == 3
    assert offer.start_time_ticks == 419900
    assert offer.refused_because is None


def test_a_zombie_of_init_offers_no_parent_to_kill():
    offer = preview(4210).parent_offer
    assert offer.pid == 1
    assert "PID 1" in offer.refused_because


def test_a_d_state_target_is_allowed_with_a_warning():
    result = preview(4300)
    assert result.ok
    assert len(result.warnings) == 1
    assert "uninterruptible sleep" in result.warnings[0]
    assert "kernel call returns" in result.warnings[0]


def test_descendants_become_targets_and_refused_ones_are_listed_with_why():
    result = preview(4120, include_descendants=True)
    assert result.ok
    assert [t.pid for t in result.targets] == [4120, 4121, 4123]
    excluded = {e.pid: e.why for e in result.excluded}
    assert set(excluded) == {4122, 4124}
    assert "zombie" in excluded[4122]
    assert "protected" in excluded[4124]


def test_without_descendants_only_the_process_itself_is_targeted():
    result = preview(4120)
    assert [t.pid for t in result.targets] == [4120]
    assert result.excluded == []


def test_an_unknown_owner_cannot_be_verified_and_is_refused():
    doc = lab_snapshot(replace={4600: proc(4600, uid=None, user=None)})
    doc["processes"] = [p for p in doc["processes"]]
    result = resolve(doc, 4600, 460000)
    assert "uid" in result.refusal


@pytest.mark.parametrize("pid", [4120, 4300, 4600])
def test_the_preview_keeps_the_boot_id_and_snapshot_time(pid):
    result = preview(pid)
    assert result.boot_id == lab_snapshot()["host"]["boot_id"]
    assert result.snapshot_taken_at is not None
