"""Real processes for the probe's tests, run as `python workloads.py KIND ARGS...`.

Each prints one JSON line when it is in the state the test wants (children
forked, device files open, zombies made) and then sleeps until it is killed:
{"pid": <its pid>, "children": [<pids of the processes it made>], ...}.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def ready(**fields: object) -> None:
    sys.stdout.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


def sleep_forever() -> None:
    while True:
        signal.pause()


def fork(child: object) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            child()  # type: ignore[operator]
        finally:
            os._exit(0)
    return pid


def zombie_parent(count: str) -> None:
    """Forks children that exit at once, and never waits for them."""
    children = [fork(lambda: None) for _ in range(int(count))]
    ready(children=children)
    sleep_forever()


def reap_forever() -> None:
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.05)


def fork_workers(device: str, count: int) -> list[int]:
    """Forks workers that each hold the device file open until they die; returns once all have."""
    opened_read, opened_write = os.pipe()

    def worker() -> None:
        os.open(device, os.O_RDONLY)
        os.write(opened_write, b"o")
        sleep_forever()

    children = [fork(worker) for _ in range(count)]
    for _ in children:
        os.read(opened_read, 1)
    return children


def launcher(device: str, count: str, *_arguments: str) -> None:
    """Forks workers that each hold the device file open (a torchrun-like launcher); extra
    arguments only lengthen the command line, which the workers share."""
    ready(children=fork_workers(device, int(count)), sid=os.getsid(0))
    sleep_forever()


def job(device: str, count: str, shape: str) -> None:
    """A launcher that leads nothing, forking workers that hold the device file, under a
    parent that lives on after the test kills the launcher. Started in a new session:

    - ``batch``: this process leads the session and the group, the launcher is its child (a
      Slurm batch script, torchrun's agent with a rank that dies);
    - ``script``: this process leads the session (a login shell); its child is a job of its
      own (a process group, as job control makes one) that runs the launcher (a script run
      without job control).
    """
    reports_read, reports_write = os.pipe()

    def run_launcher() -> None:
        workers = fork_workers(device, int(count))
        os.write(reports_write, json.dumps({"launcher": os.getpid(), "workers": workers}).encode() + b"\n")
        sleep_forever()

    def script() -> None:
        os.setpgid(0, 0)
        fork(run_launcher)
        reap_forever()

    parent = fork(script) if shape == "script" else os.getpid()
    if shape != "script":
        fork(run_launcher)
    with os.fdopen(reports_read) as reports:
        report = json.loads(reports.readline())
    others = [parent] if parent != os.getpid() else []
    ready(**report, parent=parent, sid=os.getsid(0), children=[*report["workers"], *others])
    reap_forever()


def daemon(device: str) -> None:
    """The classic daemon: fork, setsid (the child leads a new session), fork again and let the
    session leader exit, so the daemon leads nothing and is adopted. It and a worker of its own
    hold the device file."""
    reports_read, reports_write = os.pipe()

    def daemon_body() -> None:
        workers = fork_workers(device, 1)
        os.open(device, os.O_RDONLY)
        os.write(reports_write, json.dumps({"daemon": os.getpid(), "workers": workers}).encode() + b"\n")
        sleep_forever()

    def detach() -> None:
        os.setsid()
        fork(daemon_body)  # and this session leader exits on purpose

    os.waitpid(fork(detach), 0)
    with os.fdopen(reports_read) as reports:
        report = json.loads(reports.readline())
    ready(daemon=report["daemon"], children=[report["daemon"], *report["workers"]])
    sleep_forever()


def reaper(device: str, count: str) -> None:
    """A child subreaper (like systemd --user or tini) that starts a launcher in a new
    session and reaps whatever comes back to it."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    started = subprocess.Popen([sys.executable, __file__, "launcher", device, count],
                               start_new_session=True, stdout=subprocess.PIPE)
    assert started.stdout is not None
    launched = json.loads(started.stdout.readline())
    ready(launcher=launched["pid"], children=launched["children"], sid=os.getsid(0))
    reap_forever()


def holder(device: str, *_ignored: str) -> None:
    """Holds the device file open; extra arguments only lengthen the command line."""
    os.open(device, os.O_RDONLY)
    ready(children=[])
    sleep_forever()


def holder_of(*paths: str) -> None:
    """Holds each path open (a path named twice is opened twice)."""
    for path in paths:
        os.open(path, os.O_RDONLY)
    ready(children=[])
    sleep_forever()


def holder_with_child(device: str) -> None:
    """Holds the device file and has a child that does not."""
    fd = os.open(device, os.O_RDONLY)

    def child() -> None:
        os.close(fd)
        sleep_forever()

    ready(children=[fork(child)])
    sleep_forever()


def hostile(device: str, name: str, *_arguments: str) -> None:
    """Holds the device file under a process name (comm) chosen to confuse parsers;
    its command line is whatever the test passed."""
    prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()))
    os.open(device, os.O_RDONLY)
    ready(children=[])
    sleep_forever()


def threads(count: str) -> None:
    """Many threads in one process (each one uses a PID)."""
    import threading

    started = threading.Barrier(int(count) + 1)

    def idle() -> None:
        started.wait()
        sleep_forever()

    for _ in range(int(count)):
        threading.Thread(target=idle, daemon=True).start()
    started.wait()
    ready(children=[])
    sleep_forever()


def leader_exited(device: str) -> None:
    """Holds the device file, then its main thread exits (pthread_exit) while another runs on:
    /proc shows the process "Z" with no command line and no open file, yet it runs and holds it."""
    import threading

    os.open(device, os.O_RDONLY)

    def leader_state() -> str:
        # /proc/self, read from any thread, is the process's entry: its leader's state.
        with open("/proc/self/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def live_on() -> None:
        while leader_state() != "Z":
            time.sleep(0.01)
        ready(children=[])
        sleep_forever()

    threading.Thread(target=live_on).start()
    ctypes.CDLL(None).pthread_exit(None)  # ctypes lets go of the GIL first


def sleeper() -> None:
    ready(children=[])
    sleep_forever()


KINDS = {
    "zombie-parent": zombie_parent,
    "launcher": launcher,
    "job": job,
    "daemon": daemon,
    "reaper": reaper,
    "holder": holder,
    "holder-of": holder_of,
    "holder-with-child": holder_with_child,
    "hostile": hostile,
    "sleeper": sleeper,
    "threads": threads,
    "leader-exited": leader_exited,
}

if __name__ == "__main__":
    # Should the test run itself be killed, this process goes with it (its forked children
    # do not inherit this: the orphan test needs workers that outlive their launcher).
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    KINDS[sys.argv[1]](*sys.argv[2:])
