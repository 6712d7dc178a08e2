"""What changed for each target between the request and the newest snapshot:
the approval screen says it plainly before a second admin approves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuadmin.fleet.process_tree import ProcessRow, process_rows
from gpuadmin.text import human_bytes, process_state

if TYPE_CHECKING:
    from gpuadmin.kills.models import KillTarget


@dataclass
class TargetNow:
    target: KillTarget
    # The same process (same PID and start time) in the newest snapshot, if it is there.
    row: ProcessRow | None
    changes: list[str] = field(default_factory=list)
    # True when the newest snapshot shows the process has ended (or was replaced).
    gone: bool = False
    # True when the agent would refuse it as it is now (a different command line).
    will_be_refused: bool = False

    @property
    def gpu_memory_now_bytes(self) -> int | None:
        return self.row.total_gpu_memory_bytes if self.row else None


def compare(targets: list[KillTarget], document: dict[str, Any] | None) -> list[TargetNow]:
    if document is None:
        return [TargetNow(target=t, row=None, changes=["no snapshot from this host to compare with"])
                for t in targets]
    rows = process_rows(document)
    # ProcessRow leaves out the digest; it is what the agent checks, so compare it too.
    digests = {p["pid"]: p.get("cmdline_sha256") for p in document.get("processes", ())}
    boot_id = document.get("host", {}).get("boot_id", "")
    result: list[TargetNow] = []
    for target in targets:
        now = TargetNow(target=target, row=None)
        result.append(now)
        if boot_id and boot_id != target.boot_id:
            now.gone = True
            now.changes.append("the host has rebooted since the request: this process no longer exists")
            continue
        row = rows.get(target.pid)
        if row is None:
            now.gone = True
            now.changes.append(
                "no longer in the snapshot: it has exited, or no longer holds GPU memory or a GPU device"
            )
            continue
        if row.start_time_ticks != target.start_time_ticks:
            now.gone = True
            now.changes.append(
                f"PID {target.pid} is now a different process (start time changed): the original has exited"
            )
            continue
        now.row = row
        if row.state != target.state:
            if row.is_zombie:
                now.gone = True
                now.changes.append("it has exited and is now a zombie, not yet reaped by its parent")
            else:
                now.changes.append(f"was {process_state(target.state)}, now {process_state(row.state)}")
        if digests.get(row.pid) != target.cmdline_sha256:
            now.will_be_refused = True
            now.changes.append("its command line changed (it ran exec): the agent will refuse to signal it")
        before, after = target.total_gpu_memory_bytes, row.total_gpu_memory_bytes
        if before != after:
            now.changes.append(f"GPU memory {human_bytes(before)} → {human_bytes(after)}")
        if row.user != (target.user or None) and target.user:
            now.changes.append(f"owner was {target.user}, now {row.user}")
    return result
