"""Findings that act: each finding's remedy as links a person can follow.

The kinds decide what is offered (gpuadmin/fleet/findings/rules.py and
/work/shared/DOMAIN.md): orphans of one dead launcher are one kill request for
all of them; zombies are dealt with through their parent (ask it to reap, or
end it), never by signalling the zombies; a process in D state is not
killable now; memory no process accounts for is the container's or the
driver's business, never a kill. Links to the processes' pages come with all
of them. Kill links appear only for people who may file requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse

from gpuadmin.fleet.models import Finding, Host
from gpuadmin.kills.plans import REAP_PLAN_NAME
from gpuadmin.text import human_bytes, human_duration

Kind = Finding.Kind


@dataclass(frozen=True)
class FindingAction:
    label: str
    url: str | None  # None: a statement, not a link (e.g. "not killable now")
    kind: str  # "process" (a link to a process page), "kill", "reap", "reset" (a GPU reset request), "note"


@dataclass(frozen=True)
class FindingView:
    finding: Finding
    facts: list[str]
    actions: list[FindingAction]


def _process_url(host: Host, pid: int, start: int | None) -> str | None:
    if start is None:
        return None
    return reverse("process_detail", args=[host.name, pid, start])


def kill_request_url(host: Host, targets: list[tuple[int, int]], *, plan: str | None = None) -> str:
    """The new-request form, pre-filled: the first target, the others as ``also`` (pid:start,...)."""
    (pid, start), rest = targets[0], targets[1:]
    params: dict[str, Any] = {"host": host.name, "pid": pid, "start": start}
    if rest:
        params["also"] = ",".join(f"{p}:{s}" for p, s in rest)
    if plan:
        params["plan"] = plan
    return f"{reverse('kill_request_new')}?{urlencode(params)}"


def _targets(details: dict[str, Any]) -> list[tuple[int, int]]:
    return [(int(pid), int(start)) for pid, start in details.get("targets") or []]


def _process_links(host: Host, targets: list[tuple[int, int]]) -> list[FindingAction]:
    return [
        FindingAction(f"pid {pid}", _process_url(host, pid, start), "process") for pid, start in targets[:10]
    ]


def _kill_all(
    host: Host, targets: list[tuple[int, int]], details: dict[str, Any], what: str
) -> FindingAction:
    frees = human_bytes(details.get("gpu_memory_bytes") or 0)
    return FindingAction(f"{what} (frees {frees})", kill_request_url(host, targets), "kill")


def _orphans(host: Host, details: dict[str, Any], may_request: bool) -> tuple[list[str], list[FindingAction]]:
    targets = _targets(details)
    actions = _process_links(host, targets)
    if may_request and targets:
        what = f"Request one kill of all {len(targets)}" if len(targets) > 1 else "Request kill"
        actions.append(_kill_all(host, targets, details, what))
    return [], actions


def _zombies(host: Host, details: dict[str, Any], may_request: bool) -> tuple[list[str], list[FindingAction]]:
    pid, start = details.get("parent_pid"), details.get("parent_start_time_ticks")
    count = details.get("zombie_count", 0)
    alive = details.get("parent_elapsed_seconds")
    alive_for = human_duration(alive) if alive is not None else "for an unknown time"
    facts = [
        f"Parent pid {pid} ({details.get('parent_user') or 'unknown user'}), alive {alive_for}, holds "
        f"{count} zombie{'s' if count != 1 else ''}; signalling the zombies does nothing."
    ]
    actions: list[FindingAction] = []
    if start is not None and pid is not None:
        actions.append(FindingAction(f"parent {pid}", _process_url(host, pid, start), "process"))
        if may_request and pid != 1:
            reap = kill_request_url(host, [(pid, start)], plan=REAP_PLAN_NAME)
            actions.append(FindingAction("Ask the parent to reap (SIGCHLD)", reap, "reap"))
            actions.append(
                FindingAction("Request kill of the parent", kill_request_url(host, [(pid, start)]), "kill")
            )
    return facts, actions


def _not_killable(
    host: Host, details: dict[str, Any], may_request: bool
) -> tuple[list[str], list[FindingAction]]:
    pid, start = details.get("pid"), details.get("start_time_ticks")
    actions = (
        [FindingAction(f"pid {pid}", _process_url(host, pid, start), "process")] if pid is not None else []
    )
    actions.append(FindingAction("not killable now: signals wait for its kernel call", None, "note"))
    return [], actions


def _unattributed(
    host: Host, details: dict[str, Any], may_request: bool
) -> tuple[list[str], list[FindingAction]]:
    return [], [
        FindingAction("no kill: no process here holds this memory (container or driver)", None, "note")
    ]


def _leak(host: Host, details: dict[str, Any], may_request: bool) -> tuple[list[str], list[FindingAction]]:
    pid, start = details["pid"], details["start_time_ticks"]
    facts = [f"Rising since {details['rising_since']}."] if details.get("rising_since") else []
    actions = [FindingAction(f"pid {pid}: see its chart", _process_url(host, pid, start), "process")]
    if may_request:
        actions.append(FindingAction("Request kill", kill_request_url(host, [(pid, start)]), "kill"))
    return facts, actions


def _idle(host: Host, details: dict[str, Any], may_request: bool) -> tuple[list[str], list[FindingAction]]:
    targets = _targets(details)
    actions = _process_links(host, targets)
    if may_request and targets:
        actions.append(_kill_all(host, targets, details, "Request kill of the holders"))
    return [f"Idle since {details.get('idle_since')}."], actions


def _pids(host: Host, details: dict[str, Any], may_request: bool) -> tuple[list[str], list[FindingAction]]:
    return [f"Forecast: pid_max reached around {details.get('forecast_at')}."], []


def _not_released(host: Host, details: dict[str, Any], may_request: bool
                  ) -> tuple[list[str], list[FindingAction]]:
    """A kill's memory that did not come back: its request, and a GPU reset where no process holds it."""
    actions = []
    if details.get("kill_request_id"):
        pk = details["kill_request_id"]
        actions.append(FindingAction(f"kill request #{pk}", reverse("kill_request_detail", args=[pk]),
                                     "process"))
    steps = details.get("next_steps") or []
    if may_request and any("GPU reset" in step for step in steps):
        for uuid, gpu in (details.get("per_gpu") or {}).items():
            query = urlencode({"host": host.name, "gpu": uuid})
            actions.append(FindingAction(f"Request a GPU reset of GPU {gpu.get('index', uuid)}",
                                         f"{reverse('gpu_reset_request_new')}?{query}", "reset"))
    return [], actions


_BY_KIND = {
    Kind.ORPHAN_GPU: _orphans,
    Kind.ZOMBIES: _zombies,
    Kind.UNINTERRUPTIBLE_GPU: _not_killable,
    Kind.UNKILLABLE: _not_killable,
    Kind.UNATTRIBUTED_MEMORY: _unattributed,
    Kind.SUSPECTED_LEAK: _leak,
    Kind.IDLE_HOLDER: _idle,
    Kind.PIDS_RUNNING_OUT: _pids,
    Kind.MEMORY_NOT_RELEASED: _not_released,
}


def finding_view(finding: Finding, host: Host, *, may_request: bool) -> FindingView:
    describe = _BY_KIND.get(Kind(finding.kind))
    facts, actions = describe(host, finding.details or {}, may_request) if describe else ([], [])
    return FindingView(finding=finding, facts=facts, actions=actions)
