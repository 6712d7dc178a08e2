"""The agent's protected executables: processes it never signals, whatever an order says (docs/security.md).

Central's refusal rules run when a request is filed, on what a snapshot says;
this list is checked on the host, on what the agent reads itself right before each
signal, and central cannot lower it. It matches the *executable* the kernel
shows at /proc/<pid>/exe, never argv: the owner of a process writes its argv
(a job could call itself "sshd" to become unkillable, or a daemon could hide),
but not which file the kernel executes.

The list is set on the host only: GPUADMIN_AGENT_PROTECTED_EXECUTABLES, a JSON
list of regular expressions or one per line (commas inside a pattern are
fine), searched in the resolved path. The entry ``@default`` stands for
DEFAULT_PROTECTED_EXECUTABLES; unset, the defaults apply. Beside it, the
agent's own pool processes (its siblings running its command line) are never
signalled, as PID 1, kernel threads, the agent and its ancestors never are.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuadmin.probe import procfs
from gpuadmin.wire.kill_protocol import Refusal

PROTECTED_EXECUTABLES_VARIABLE = "GPUADMIN_AGENT_PROTECTED_EXECUTABLES"
DEFAULT_MARKER = "@default"
# Searched in the resolved executable path; each anchored on a path component.
DEFAULT_PROTECTED_EXECUTABLES = (
    r"(^|/)sshd$",
    r"(^|/)(systemd|systemd-[^/]+)$",
    r"(^|/)init$",
    r"(^|/)containerd(-shim[^/]*)?$",
    r"(^|/)(dockerd|docker-proxy)$",
    r"(^|/)kubelet$",
    r"(^|/)nvidia-persistenced$",
    r"(^|/)nv-fabricmanager$",
    r"(^|/)(nv-hostengine|dcgm[^/]*)$",
    r"(^|/)redis-server$",
    r"(^|/)(postgres|postmaster)$",
)


def pattern_list(text: str, variable: str) -> list[str]:
    """Regular expressions from a setting: a JSON list, or one per line; never split on commas.

    The one format of every pattern setting (the agent's protected executables, and central's
    GPUADMIN_PROTECTED_COMMAND_PATTERNS): a comma is part of many patterns (``a{1,3}``).
    """
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            entries = json.loads(stripped)
        except ValueError as error:
            raise ValueError(f"{variable}: not a JSON list: {error}") from None
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ValueError(f"{variable}: a JSON list of strings is expected")
        return [entry for entry in entries if entry]
    return [line.strip() for line in stripped.splitlines() if line.strip()]


def parse_patterns(text: str) -> tuple[str, ...]:
    """The protected executables' patterns from their setting; ``@default`` adds the defaults."""
    patterns: list[str] = []
    for entry in pattern_list(text, PROTECTED_EXECUTABLES_VARIABLE):
        if entry == DEFAULT_MARKER:
            patterns.extend(DEFAULT_PROTECTED_EXECUTABLES)
        else:
            re.compile(entry)  # a broken pattern stops the agent at start, not at a kill
            patterns.append(entry)
    return tuple(patterns)


@dataclass(frozen=True, slots=True)
class ProtectedExecutables:
    patterns: tuple[str, ...] = DEFAULT_PROTECTED_EXECUTABLES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProtectedExecutables:
        environ = os.environ if environ is None else environ
        text = environ.get(PROTECTED_EXECUTABLES_VARIABLE)
        return cls() if text is None or not text.strip() else cls(parse_patterns(text))

    def refusal(self, pid: int) -> tuple[Refusal, str] | None:
        """Why the process behind ``pid`` must not be signalled, read now; None when nothing forbids it.

        Call it while holding the target's pidfd and after its start time was
        verified, so that the executable read is the target's own.
        """
        if _is_agent_sibling(pid):
            return (Refusal.AGENT, f"PID {pid} is one of the agent's own worker processes")
        if not self.patterns:
            return None  # the host's admin emptied the list: nothing to read the executable for
        try:
            path = procfs.read_executable(pid)
        except FileNotFoundError:
            return None  # gone, a zombie or a kernel thread: the identity checks say which
        except OSError as error:
            return (Refusal.UNVERIFIABLE_EXECUTABLE,
                    f"could not read /proc/{pid}/exe ({error.strerror}), so the agent's protected "
                    "executables cannot be checked; the agent needs CAP_SYS_PTRACE to read other users' "
                    "executables")
        for pattern in self.patterns:
            if re.search(pattern, path):
                return (Refusal.PROTECTED_EXECUTABLE,
                        f"its executable {path} is protected on this host "
                        f"({PROTECTED_EXECUTABLES_VARIABLE}: {pattern!r})")
        return None


def _is_agent_sibling(pid: int) -> bool:
    """A fork sibling of this process running its command line: another pool process of the agent."""
    own, other = procfs.read_stat(os.getpid()), procfs.read_stat(pid)
    if own is None or other is None or own.ppid != other.ppid:
        return False
    return procfs.read_cmdline_bytes(pid) == procfs.read_cmdline_bytes(os.getpid())
