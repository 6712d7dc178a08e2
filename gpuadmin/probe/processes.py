"""The process table from /proc: one cheap pass over every PID, then the
costlier details (command line, uid) for the few that go in a snapshot; their
cgroup (the owner) is read by gpuadmin/probe/owners.py.

Direct reads of /proc/<pid>/stat are used instead of psutil: a psutil.Process
per PID costs several times more (see benchmarks/probe_vs_manual.py), and stat
already holds everything the full table needs (state, ppid, pgid, sid, flags,
start time, RSS).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable

from gpuadmin.probe.procfs import (
    CLOCK_TICKS_PER_SECOND,
    ZOMBIE_STATE,
    StatFields,
    cmdline_sha256,
    parse_stat,
    process_state,
    read_cmdline_bytes,
    read_executable,
    wait_channel,
)

PAGE_SIZE_BYTES = os.sysconf("SC_PAGE_SIZE")
CMDLINE_MAX_ARGUMENTS = 4096  # the schema's limit; reached only by a command line of empty arguments
UNINTERRUPTIBLE = "D"

_user_names: dict[int, str | None] = {}


def list_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def read_stats(pids: Iterable[int]) -> dict[int, StatFields]:
    """/proc/<pid>/stat of every PID still alive; PIDs that exit meanwhile are left out."""
    # os.open/os.read: no file object per PID, which is most of the cost of open() here.
    stats: dict[int, StatFields] = {}
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError):
            continue
        try:
            data = os.read(fd, 4096)
        except ProcessLookupError:
            continue
        finally:
            os.close(fd)
        if data:
            stats[pid] = parse_stat(data.decode("utf-8", "replace"))
    return stats


def read_uptime_seconds() -> float:
    with open("/proc/uptime", "rb") as f:
        return float(f.read().split()[0])


def split_cmdline(raw: bytes, max_bytes: int) -> tuple[list[str], bool]:
    """argv from the raw NUL-separated bytes, keeping at most max_bytes of them.

    Undecodable bytes become U+FFFD; nothing else is changed (escaping is the
    reader's job). A command line that never contained a NUL (a process that
    rewrote its argv with spaces) comes back as one string.
    """
    truncated = len(raw) > max_bytes
    parts = (raw[:max_bytes] if truncated else raw).split(b"\0")
    # The terminating NUL leaves an empty last part; after a cut, so does a cut right after a NUL.
    if parts and parts[-1] == b"":
        parts.pop()
    if len(parts) > CMDLINE_MAX_ARGUMENTS:
        parts, truncated = parts[:CMDLINE_MAX_ARGUMENTS], True
    return [part.decode("utf-8", "replace") for part in parts], truncated


def read_status_uid(pid: int) -> int | None:
    """The real uid (first number of the Uid: line of /proc/<pid>/status)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    start = data.find(b"\nUid:")
    if start < 0:
        return None
    return int(data[start + 5 : data.index(b"\n", start + 5)].split()[0])


def user_name(uid: int | None) -> str | None:
    """The passwd name of uid, None when unknown (uids from a container's own passwd, say)."""
    if uid is None:
        return None
    if uid not in _user_names:
        try:
            _user_names[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _user_names[uid] = None
    return _user_names[uid]


def _command_and_executable(pid: int) -> tuple[bytes, str | None]:
    """A live process's raw command line and executable path (None when it may not be read)."""
    try:
        raw = read_cmdline_bytes(pid) or b""  # b"": gone since the stat pass; the row still says what it was
    except PermissionError:
        raw = b""
    try:
        exe: str | None = read_executable(pid)
    except OSError:
        exe = None  # a kernel thread, or another user's process without CAP_SYS_PTRACE
    return raw, exe


def describe(stat: StatFields, *, uptime_seconds: float, cmdline_max_bytes: int) -> dict[str, object]:
    """The snapshot row of one process (without the snapshot-level fields:
    container_id, owner, orphaned, reasons, gpu_memory_bytes, device_files)."""
    pid = stat.pid
    # A zombie has neither any more (the kernel released its memory and executable): not read, which
    # also spares each of a host's zombies the look through its threads that an empty answer starts.
    raw, exe = (b"", None) if stat.zombie else _command_and_executable(pid)
    argv, truncated = split_cmdline(raw, cmdline_max_bytes)
    uid = read_status_uid(pid)
    start_seconds = stat.start_time_ticks / CLOCK_TICKS_PER_SECOND
    state = process_state(stat)
    row: dict[str, object] = {
        "pid": pid,
        "ppid": stat.ppid,
        # Not "Z" for a process whose leader exited: central would take it for a zombie, which
        # cannot be killed, and refuse the kill that frees its GPU memory.
        "state": state,
        "start_time_ticks": stat.start_time_ticks,
        "uid": uid,
        "user": user_name(uid),
        "name": stat.comm,
        "cmdline": argv,
        "cmdline_truncated": truncated,
        "cmdline_sha256": cmdline_sha256(raw),
        "exe": exe,
        "rss_bytes": max(stat.rss_pages, 0) * PAGE_SIZE_BYTES,
        "pgid": stat.pgid if stat.pgid >= 0 else None,
        "sid": stat.sid if stat.sid >= 0 else None,
        "elapsed_seconds": round(max(uptime_seconds - start_seconds, 0.0), 2),
        "kernel_thread": stat.kernel_thread,
    }
    if stat.leader_exited and state != ZOMBIE_STATE:
        row["leader_exited"] = True  # its GPU memory stays held until the last thread ends
    if state == UNINTERRUPTIBLE:
        row.update(wait_channel(stat))  # no signal acts on it: say what it waits on
    return row
