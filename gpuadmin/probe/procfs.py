"""Direct /proc readers shared by the snapshot and the kill executor.

Reading /proc/<pid>/stat ourselves is several times faster than building a
psutil.Process per PID, and it gives the start time in clock ticks exactly as
the kernel keeps it (field 22), which is what a kill target is identified by.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

# Plain open() throughout, not pathlib: importing pathlib costs the short-lived
# probe CLI a few milliseconds of start-up, and this was the only module on its path using it.
PF_KTHREAD = 0x00200000  # include/linux/sched.h: "I am a kernel thread"
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class StatFields:
    """The fields of /proc/<pid>/stat the product uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    flags: int
    start_time_ticks: int
    rss_pages: int

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def parse_stat(text: str) -> StatFields:
    """Parse one /proc/<pid>/stat line.

    comm sits between the first '(' and the *last* ')': a process may name
    itself ") R 1 (" to confuse naive parsers, and users control that name.
    """
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    pid = int(text[:open_paren])
    comm = text[open_paren + 1 : close_paren]
    rest = text[close_paren + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return StatFields(
        pid=pid,
        comm=comm,
        state=rest[0],
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        flags=int(rest[6]),
        start_time_ticks=int(rest[19]),
        rss_pages=int(rest[21]),
    )


def read_stat(pid: int) -> StatFields | None:
    """The stat fields of a live PID, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_stat(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None


def read_cmdline_bytes(pid: int) -> bytes | None:
    """The raw NUL-separated command line; b"" for kernel threads and zombies; None when gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def cmdline_sha256(raw: bytes) -> str:
    """Digest of the full raw command line: the identity a kill target carries,
    computed before any truncation for display."""
    return hashlib.sha256(raw).hexdigest()


def _status_number(pid: int, label: str) -> int | None:
    """The first number on the ``label`` line (e.g. "Uid:") of /proc/<pid>/status; None when gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(label):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def read_uid(pid: int) -> int | None:
    """The real uid, from the Uid: line of /proc/<pid>/status."""
    return _status_number(pid, "Uid:")


def read_boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def read_pid_max() -> int:
    with open("/proc/sys/kernel/pid_max", encoding="ascii") as f:
        return int(f.read())


def read_tgid(pid: int) -> int | None:
    """The thread group (process) id that /proc/<pid> belongs to, from the Tgid: line.

    /proc/<tid> answers for any thread id too, though it is hidden from the
    listing; a thread id differs from its Tgid, and kill() on it would hit the
    whole process it belongs to.
    """
    return _status_number(pid, "Tgid:")
