"""Who holds the GPU device files open, the way `fuser -v /dev/nvidia*` finds out:
every process's open files, /proc/<pid>/fd/*, compared with the device glob.

A worker that holds /dev/nvidia* keeps its CUDA context (and often GPU memory)
whatever its name is, so this catches holders that `ps | grep python` misses.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuadmin.probe.procfs import other_thread_dirs

_WILDCARDS = re.compile(r"[*?\[]")


class DeviceMatcher:
    """Does an open file's path match the device glob?

    The glob's fixed directory is resolved once (so /tmp/x/dev* still matches
    when /tmp/x is a symlink: the kernel reports resolved paths); `*` matches
    across '/' as in fnmatch, so /dev/nvidia* also covers /dev/nvidia-caps/*.
    """

    def __init__(self, glob: str) -> None:
        self.glob = glob
        directory, _, last = glob.rpartition("/")
        if directory and not _WILDCARDS.search(directory):
            directory = os.path.realpath(directory)
            glob = f"{directory}/{last}"
        wildcard = _WILDCARDS.search(glob)
        # Most open files (sockets, pipes, /usr/lib/...) fail this cheap prefix test.
        self._prefix = glob[: wildcard.start()] if wildcard else glob
        self._pattern = re.compile(fnmatch.translate(glob))

    def matches(self, path: str) -> bool:
        return path.startswith(self._prefix) and self._pattern.match(path) is not None


@dataclass(slots=True)
class DeviceScan:
    holders: dict[int, list[str]] = field(default_factory=dict)  # pid -> sorted distinct device paths
    denied_pids: int = 0  # processes whose open files we may not read (another user's, without root)


def open_device_files(pid: int, matcher: DeviceMatcher) -> list[str] | None:
    """The device paths pid holds open (sorted, distinct); None when we may not look."""
    return _open_device_files_in(f"/proc/{pid}", matcher, pid)


def _open_device_files_in(directory: str, matcher: DeviceMatcher, pid: int | None) -> list[str] | None:
    """Those of the /proc entry ``directory`` (a process's, or with ``pid`` None one of its threads')."""
    # Links are read relative to the open fd directory: the kernel then resolves one
    # name per link instead of walking /proc/<pid>/fd/<n> from the root for each.
    try:
        fd_dir = os.open(f"{directory}/fd", os.O_RDONLY | os.O_DIRECTORY)
    except PermissionError:
        return None
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return []
    try:
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            return None
        except (FileNotFoundError, ProcessLookupError):
            return []
        if not fds and pid is not None:
            # No open file at all: perhaps a process whose leader has exited, whose files
            # only its other threads show (procfs.other_thread_dirs). Rare, so cheap.
            return _open_device_files_of_threads(pid, matcher)
        readlink = os.readlink
        matches = matcher.matches
        found: set[str] = set()
        for fd in fds:
            try:
                target = readlink(fd, dir_fd=fd_dir)
            except OSError:  # closed meanwhile, or the process exited
                continue
            if matches(target):
                found.add(target)
        return sorted(found)
    finally:
        os.close(fd_dir)


def _open_device_files_of_threads(pid: int, matcher: DeviceMatcher) -> list[str] | None:
    # Its threads share its open files; one that exited meanwhile shows none, so ask on.
    for directory in other_thread_dirs(pid):
        found = _open_device_files_in(directory, matcher, None)
        if found is None or found:
            return found
    return []


def scan_device_holders(pids: Iterable[int], matcher: DeviceMatcher) -> DeviceScan:
    scan = DeviceScan()
    for pid in pids:
        files = open_device_files(pid, matcher)
        if files is None:
            scan.denied_pids += 1
        elif files:
            scan.holders[pid] = files
    return scan
