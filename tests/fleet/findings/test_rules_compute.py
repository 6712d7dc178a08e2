"""compute_findings: each kind appears when the snapshot shows it, and only then, with the right remedy."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from gpuadmin.fleet.findings.rules import FindingDraft, compute_findings, describe
from gpuadmin.fleet.models import Finding
from gpuadmin.fleet.process_tree import ProcessRow
from tests.factories import GiB, gpu, proc, snapshot

Kind = Finding.Kind
Severity = Finding.Severity
MiB = 1024**2
GPU0 = "GPU-sim-0000"


def of_kind(document: dict[str, Any], kind: str) -> list[FindingDraft]:
    return [d for d in compute_findings(document) if d.kind == kind]


def trainer_with_zombies(count: int, *, parent_pid: int = 4120) -> list[dict[str, Any]]:
    parent = proc(parent_pid, name="python", cmdline=["python", "train.py"], user="alice")
    zombies = [
        proc(parent_pid + 1 + i, ppid=parent_pid, state="Z", name="python", cmdline=[], user="alice")
        for i in range(count)
    ]
    return [parent, *zombies]


# --- zombies --------------------------------------------------------------


def test_zombies_are_one_finding_per_parent_that_names_the_parent() -> None:
    document = snapshot(processes=trainer_with_zombies(5) + trainer_with_zombies(2, parent_pid=7000))
    drafts = of_kind(document, Kind.ZOMBIES)
    assert [d.title for d in drafts] == [
        "5 zombies under python train.py (pid 4120, alice)",
        "2 zombies under python train.py (pid 7000, alice)",
    ]
    assert drafts[0].key == "4120:412000"
    assert drafts[0].details["zombie_count"] == 5
    assert drafts[0].details["zombie_pids"] == [4121, 4122, 4123, 4124, 4125]


def test_zombie_remedy_is_about_the_parent_never_the_zombie() -> None:
    (draft,) = of_kind(snapshot(processes=trainer_with_zombies(5)), Kind.ZOMBIES)
    assert "python (pid 4120)" in draft.remedy
    assert "wait()" in draft.remedy
    assert "end the parent" in draft.remedy
    assert "kill -9 on a zombie does nothing" in draft.remedy
    for zombie_pid in range(4121, 4126):
        assert str(zombie_pid) not in draft.remedy


def test_zombies_of_pid_1_point_at_a_missing_init() -> None:
    init = proc(1, ppid=0, name="sleep", cmdline=["sleep", "infinity"], user="root")
    zombie = proc(50, ppid=1, state="Z", cmdline=[])
    (draft,) = of_kind(snapshot(processes=[init, zombie]), Kind.ZOMBIES)
    assert "PID 1 is not reaping" in draft.remedy
    assert "--init" in draft.remedy


@pytest.mark.parametrize(
    ("count", "severity"),
    [
        (1, Severity.INFO),
        (9, Severity.INFO),
        (10, Severity.WARNING),
        (999, Severity.WARNING),
        (1000, Severity.CRITICAL),
    ],
)
def test_zombie_severity_grows_with_their_number(count: int, severity: str) -> None:
    (draft,) = of_kind(snapshot(processes=trainer_with_zombies(count)), Kind.ZOMBIES)
    assert draft.severity == severity
    assert draft.title.startswith(f"{count} zombie{'s' if count > 1 else ''} under")


def test_no_zombies_no_finding() -> None:
    assert of_kind(snapshot(processes=[proc(10), proc(11, state="R")]), Kind.ZOMBIES) == []


# --- orphans --------------------------------------------------------------


def orphan_worker(
    pid: int, *, launcher: int = 4120, session: int | None = None, memory: int | None = 4 * GiB, **kw: Any
) -> dict[str, Any]:
    return proc(
        pid,
        ppid=1,
        orphaned=True,
        pgid=launcher,
        sid=session or launcher,
        user="bob",
        gpu_memory={GPU0: memory} if memory is not None else None,
        **kw,
    )


def test_orphans_holding_memory_are_grouped_by_their_dead_launcher() -> None:
    workers = [orphan_worker(p) for p in (4121, 4122, 4123)]
    other = orphan_worker(5001, launcher=5000, memory=GiB)
    drafts = of_kind(snapshot(processes=[*workers, other], gpus=[gpu(0, used=13 * GiB)]), Kind.ORPHAN_GPU)
    assert [d.title for d in drafts] == [
        "3 orphans of launcher 4120 (bob) hold 12 GiB of GPU memory",
        "1 orphan of launcher 5000 (bob) holds 1 GiB of GPU memory",
    ]
    assert drafts[0].key == "pgid:4120"
    assert drafts[0].severity == Severity.CRITICAL
    assert "kill request for pids 4121, 4122, 4123" in drafts[0].remedy
    assert drafts[0].details["targets"] == [[4121, 412100], [4122, 412200], [4123, 412300]]


def test_orphans_holding_only_a_device_file() -> None:
    workers = [orphan_worker(p, memory=None, device_files=["/dev/nvidia0"]) for p in (4121, 4122)]
    (draft,) = of_kind(snapshot(processes=workers), Kind.ORPHAN_GPU)
    assert draft.title == "2 orphans of launcher 4120 (bob) hold /dev/nvidia0 open"
    assert draft.severity == Severity.WARNING


def test_the_session_names_the_launcher_when_the_group_leader_is_alive() -> None:
    group_leader = proc(4300, ppid=1, pgid=4300, sid=4120)
    worker = orphan_worker(4301, launcher=4300, session=4120)
    (draft,) = of_kind(snapshot(processes=[group_leader, worker]), Kind.ORPHAN_GPU)
    assert draft.key == "sid:4120"


def test_orphans_without_a_gpu_and_gpu_holders_that_are_no_orphans_make_no_orphan_finding() -> None:
    idle_orphan = proc(10, ppid=1, orphaned=True, pgid=9, sid=9)
    holder = proc(11, ppid=5, gpu_memory={GPU0: GiB})
    assert of_kind(snapshot(processes=[idle_orphan, holder], gpus=[gpu(0, used=GiB)]), Kind.ORPHAN_GPU) == []


# --- D state --------------------------------------------------------------


def test_uninterruptible_process_holding_a_gpu() -> None:
    stuck = proc(4120, state="D", cmdline=["python", "train.py"], gpu_memory={GPU0: 10 * GiB})
    (draft,) = of_kind(snapshot(processes=[stuck], gpus=[gpu(0, used=10 * GiB)]), Kind.UNINTERRUPTIBLE_GPU)
    assert draft.title == "python train.py (pid 4120, alice) is in uninterruptible sleep (D) holding 10 GiB"
    assert draft.key == "4120:412000"
    assert "Signals wait until its kernel call returns" in draft.remedy
    assert "NVRM" in draft.remedy
    assert "reboot" in draft.remedy


def test_d_state_holder_says_what_it_waits_on_where_the_probe_read_it() -> None:
    stuck = proc(10, state="D", gpu_memory={GPU0: GiB}, wchan="nfs_wait_bit_killable",
                 kernel_stack=["nfs_wait_bit_killable [nfs]"])
    (draft,) = of_kind(snapshot(processes=[stuck], gpus=[gpu(0, used=GiB)]), Kind.UNINTERRUPTIBLE_GPU)
    assert draft.title.endswith("holding 1 GiB, waiting in nfs_wait_bit_killable")
    assert draft.details["kernel_stack"] == ["nfs_wait_bit_killable [nfs]"]


def test_d_state_without_gpu_or_gpu_without_d_state_is_no_finding() -> None:
    processes = [proc(10, state="D"), proc(11, state="S", gpu_memory={GPU0: GiB})]
    assert of_kind(snapshot(processes=processes, gpus=[gpu(0, used=GiB)]), Kind.UNINTERRUPTIBLE_GPU) == []


# --- unattributed memory --------------------------------------------------


@override_settings(GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES=512 * MiB)
def test_unattributed_memory_above_the_threshold_per_gpu() -> None:
    holder = proc(10, gpu_memory={GPU0: 2 * GiB})
    gpus = [gpu(0, used=8 * GiB), gpu(1, used=512 * MiB)]
    (draft,) = of_kind(snapshot(processes=[holder], gpus=gpus), Kind.UNATTRIBUTED_MEMORY)
    assert draft.key == GPU0
    assert draft.title == ("GPU 0 (Simulated H100): 6 GiB used by no visible process "
                           "(8 GiB used against 2 GiB by visible processes)")
    assert "another PID namespace" in draft.remedy
    assert "nvidia_uvm" in draft.remedy
    assert "nvidia-smi --gpu-reset -i 0" in draft.remedy
    assert draft.details["memory_unattributed_bytes"] == 6 * GiB


@override_settings(GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES=512 * MiB)
def test_unattributed_memory_at_the_threshold_is_no_finding() -> None:
    holder = proc(10, gpu_memory={GPU0: GiB})
    document = snapshot(processes=[holder], gpus=[gpu(0, used=GiB + 512 * MiB)])
    assert of_kind(document, Kind.UNATTRIBUTED_MEMORY) == []


def test_unattributed_memory_names_the_pids_the_gpu_reports_but_proc_does_not_show() -> None:
    unmatched = [{"pid": 31337, "gpu_uuid": GPU0, "used_memory_bytes": 5 * GiB}]
    (draft,) = of_kind(snapshot(gpus=[gpu(0, used=5 * GiB)], unmatched=unmatched), Kind.UNATTRIBUTED_MEMORY)
    assert "pid 31337" in draft.remedy
    assert "find the container" in draft.remedy


def test_unknown_used_memory_is_no_finding() -> None:
    assert of_kind(snapshot(gpus=[gpu(0, used=None)]), Kind.UNATTRIBUTED_MEMORY) == []


# --- memory attributed beyond what the GPU reports used -------------------


def test_more_memory_attributed_than_used_is_a_finding_per_gpu() -> None:
    holders = [proc(10, gpu_memory={GPU0: 70 * GiB}), proc(11, gpu_memory={GPU0: 52 * GiB + 614 * MiB})]
    gpus = [gpu(0, total=80 * GiB, used=80 * GiB), gpu(1, used=GiB)]
    (draft,) = of_kind(snapshot(processes=holders, gpus=gpus), Kind.OVER_ATTRIBUTED_MEMORY)
    assert draft.key == GPU0
    assert draft.severity == Severity.WARNING
    assert draft.title == ("GPU 0 (Simulated H100): processes hold 122.6 GiB, "
                           "more than the 80 GiB the GPU reports used")
    assert draft.details["memory_over_attributed_bytes"] == 42 * GiB + 614 * MiB


@pytest.mark.parametrize("used", [8 * GiB, 8 * GiB + 1, None])
def test_attributed_up_to_used_or_unknown_used_is_no_over_attribution(used: int | None) -> None:
    document = snapshot(processes=[proc(10, gpu_memory={GPU0: 8 * GiB})], gpus=[gpu(0, used=used)])
    assert of_kind(document, Kind.OVER_ATTRIBUTED_MEMORY) == []


# --- PIDs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_use", "severity"),
    [(800, None), (801, Severity.WARNING), (950, Severity.WARNING), (951, Severity.CRITICAL)],
)
def test_pid_exhaustion_above_80_percent_of_pid_max(in_use: int, severity: str | None) -> None:
    drafts = of_kind(snapshot(pid_max=1000, pids_in_use=in_use), Kind.PID_EXHAUSTION)
    if severity is None:
        assert drafts == []
    else:
        (draft,) = drafts
        assert draft.severity == severity
        assert draft.title.startswith(f"{in_use:,} of 1,000 PIDs in use")
        assert "EAGAIN" in draft.remedy


def test_pid_exhaustion_points_at_the_biggest_zombie_parent() -> None:
    document = snapshot(processes=trainer_with_zombies(5), pid_max=1000, pids_in_use=900)
    (draft,) = of_kind(document, Kind.PID_EXHAUSTION)
    assert "Most zombies (5) are under python (pid 4120)" in draft.remedy


# --- GPU data -------------------------------------------------------------


def test_gpu_data_unavailable_carries_the_backends_reason() -> None:
    document = snapshot(backend="none", available=False, reason="NVML library not found", gpus=[])
    (draft,) = of_kind(document, Kind.GPU_DATA_UNAVAILABLE)
    assert draft.title == "GPU data unavailable (none backend): NVML library not found"
    assert "nvidia-ml-py" in draft.remedy
    assert of_kind(snapshot(), Kind.GPU_DATA_UNAVAILABLE) == []


# --- wording --------------------------------------------------------------


def test_a_healthy_host_has_no_findings() -> None:
    document = snapshot(processes=[proc(10, gpu_memory={GPU0: GiB})], gpus=[gpu(0, used=GiB)])
    assert compute_findings(document) == []


def test_hostile_command_lines_lose_control_and_bidi_characters_in_titles() -> None:
    hostile = ["\x1b[31mpython", "<script>alert(1)</script>", "\u202etxt.exe", "a\nb"]
    parent = proc(4120, cmdline=hostile)
    zombie = proc(4121, ppid=4120, state="Z", cmdline=[])
    (draft,) = of_kind(snapshot(processes=[parent, zombie]), Kind.ZOMBIES)
    assert "\x1b" not in draft.title
    assert "\u202e" not in draft.title
    assert "\n" not in draft.title
    assert "<script>" in draft.title  # text, not markup: the templates escape it


def test_titles_fit_their_column() -> None:
    parent = proc(4120, cmdline=["python", "x" * 10_000], user="u" * 256)
    zombie = proc(4121, ppid=4120, state="Z", cmdline=[])
    (draft,) = of_kind(snapshot(processes=[parent, zombie]), Kind.ZOMBIES)
    assert len(draft.title) <= 300
    assert len(draft.remedy) <= 500


def test_describe_a_process_without_command_line() -> None:
    row = ProcessRow.from_document(proc(2, name="kworker/0:1", cmdline=[], user=None, uid=None))
    assert describe(row) == "[kworker/0:1] (pid 2, unknown user)"
