"""python -m gpuadmin.run — everything `make run` starts, on one box, supervised.

Migrates, makes sure an admin account exists, then starts two children:

- web: gunicorn serving gpuadmin.wsgi on 127.0.0.1:$PORT (default 8000);
- worker: one Celery worker consuming ``central`` and ``host.<this host>``
  with the embedded scheduler (-B), so this box is both central and an agent.

Each child gets its own session (and so its own process group): Ctrl+C in the
terminal reaches only this supervisor, which then stops the children in order.
On SIGINT or SIGTERM every child's process group gets SIGTERM, then SIGKILL
after a grace period, and everything is reaped before exit. The supervisor is
a child subreaper, so a grandchild whose parent dies is re-parented here, not
to PID 1, and reaped here: nothing it started is left as an orphan or zombie.

A child that dies on its own is restarted, as systemd's Restart=on-failure
would: what is left of its process group is stopped first, then it starts
again after a back-off (1 s, doubling up to 30 s). A child that keeps dying
(RESTART_LIMIT restarts within RESTART_WINDOW_SECONDS, and it died again) makes
the supervisor give up: everything is stopped and the exit status is 1. The
restart counts are kept in GPUADMIN_DATA_DIR/supervisor.json, which /healthz
and the pages' footer read (read_supervisor_state).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import math
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuadmin.data_dir import (
    DEMO_SIMULATED_GPUS,
    data_dir,
    exposure,
    prepare_data_dir,
    supervisor_state_path,
)
from gpuadmin.probe.gpus import simulated
from gpuadmin.wire.files import write_file

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_PORT = 8000
BIND_ADDRESS = "127.0.0.1"
STOP_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.1
DEFAULT_WORKER_CONCURRENCY = 4
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# A child that died RESTART_LIMIT + 1 times within the window is given up on.
RESTART_LIMIT = 5
RESTART_WINDOW_SECONDS = 300.0
RESTART_BACKOFF_FIRST_SECONDS = 1.0
RESTART_BACKOFF_MAX_SECONDS = 30.0


class StartupError(RuntimeError):
    """Something this box must fix before gpuadmin can start; the message says what."""


@dataclass
class Child:
    name: str
    argv: list[str]
    pid: int = 0
    exit_status: int | None = None  # as os.waitstatus_to_exitcode gives it: -N for signal N
    restarts: int = 0
    restarted_at: list[float] = field(default_factory=list)  # monotonic times, within the window
    restart_due: float | None = None  # when a dead child is to start again
    # The demo's scenario processes (gpuadmin/demo): stopped with the signal their story needs
    # (a trainer checkpoints on SIGINT, one ignores SIGTERM), and never restarted: a process
    # killed through the panel stays dead, and a launcher's death leaves its orphans alone.
    stop_signal: int = signal.SIGTERM
    restart: bool = True

    @property
    def running(self) -> bool:
        return self.pid > 0 and self.exit_status is None

    def describe_exit(self) -> str:
        if self.exit_status is None:
            return "is running"
        if self.exit_status < 0:
            return f"was killed by {signal.Signals(-self.exit_status).name}"
        return f"exited with status {self.exit_status}"


@dataclass
class Supervisor:
    children: list[Child]
    env: dict[str, str]
    out: Callable[[str], None] = print
    stop_grace_seconds: float = STOP_GRACE_SECONDS
    stop_requested: int | None = None  # the signal that asked us to stop
    signals_received: int = 0
    restart_backoff_first_seconds: float = RESTART_BACKOFF_FIRST_SECONDS
    restart_backoff_max_seconds: float = RESTART_BACKOFF_MAX_SECONDS
    state_path: Path | None = None  # where the restart counts are published (read_supervisor_state)
    _by_pid: dict[int, Child] = field(default_factory=dict)
    _started_at: float = field(default_factory=time.time)

    # --- signals -------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGTERM, self._on_stop_signal)

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self.signals_received += 1
        if self.stop_requested is None:
            self.stop_requested = signum

    # --- children ------------------------------------------------------------
    def start(self, child: Child) -> None:
        # posix_spawn with setsid: the child is a session (and group) leader from its first instruction.
        self._by_pid.pop(child.pid, None)
        child.pid = os.posix_spawn(child.argv[0], child.argv, self.env, setsid=True)
        child.exit_status = None
        child.restart_due = None
        self._by_pid[child.pid] = child
        self.out(f"gpuadmin: started {child.name} (pid {child.pid})")

    def reap(self) -> None:
        """Collect every exited child, ours or re-parented to us as subreaper, without blocking."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self._by_pid.get(pid)
            if child is not None:
                child.exit_status = os.waitstatus_to_exitcode(status)

    # --- restarts --------------------------------------------------------------
    def on_unexpected_exit(self, child: Child, now: float) -> bool:
        """Schedule a restart of a child that died; False when it keeps dying and we give up."""
        child.restarted_at = [t for t in child.restarted_at if now - t < RESTART_WINDOW_SECONDS]
        recent = len(child.restarted_at)
        if recent >= RESTART_LIMIT:
            self.out(f"gpuadmin: {child.name} {child.describe_exit()} unexpectedly, after {recent} restarts "
                     f"within {RESTART_WINDOW_SECONDS / 60:.0f} minutes; giving up and stopping everything")
            return False
        delay = min(self.restart_backoff_first_seconds * 2**recent, self.restart_backoff_max_seconds)
        child.restart_due = now + delay
        # What it leaves (gunicorn's workers, Celery's pool and beat) goes now:
        # the new one must not share the port or the broker with them.
        self._signal_group(child, signal.SIGTERM)
        self.out(f"gpuadmin: {child.name} {child.describe_exit()} unexpectedly; restarting it in {delay:g} s "
                 f"(restart {recent + 1} of {RESTART_LIMIT} allowed within "
                 f"{RESTART_WINDOW_SECONDS / 60:.0f} minutes)")
        return True

    def restart_if_due(self, child: Child, now: float) -> None:
        if child.restart_due is None or now < child.restart_due:
            return
        if self.group_alive(child):
            # Its old processes ignored SIGTERM until the back-off ran out.
            self._signal_group(child, signal.SIGKILL)
            return  # reaped by the next turn of the loop, then started
        child.restarts += 1
        child.restarted_at.append(now)
        self.out(f"gpuadmin: restarting {child.name} (restart {child.restarts} since start)")
        self.start(child)
        self.publish_state()

    @property
    def restarts(self) -> int:
        return sum(c.restarts for c in self.children)

    def publish_state(self) -> None:
        """Write the restart counts where the web process reads them (read_supervisor_state)."""
        if self.state_path is None:
            return
        state = {"pid": os.getpid(), "started_at": self._started_at, "restarts": self.restarts,
                 "children": {c.name: c.restarts for c in self.children}}
        try:
            # Rewritten at each restart and polled: whole, but not worth an fsync.
            write_file(self.state_path, json.dumps(state), sync=False)
        except OSError as exc:
            self.out(f"gpuadmin: cannot write {self.state_path}: {exc.strerror}")

    def remove_state(self) -> None:
        if self.state_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()

    def group_alive(self, child: Child) -> bool:
        """Whether any process (zombies included) is still in the child's process group."""
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _signal_group(self, child: Child, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    def _wait_groups_gone(self, seconds: float, stop_early: Callable[[], bool] = lambda: False) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            self.reap()
            if not any(self.group_alive(c) for c in self.children if c.pid):
                return True
            if time.monotonic() >= deadline or stop_early():
                return False
            time.sleep(POLL_SECONDS)

    def stop_all(self) -> None:
        """SIGTERM to each child (a graceful stop), SIGKILL to whatever is left of its group."""
        started = [c for c in self.children if c.pid]
        signals_before = self.signals_received
        for child in started:
            if child.running:
                # The leader first: gunicorn and Celery stop their own workers
                # gracefully (Celery finishes the task at hand).
                os.kill(child.pid, child.stop_signal)
            else:
                self._signal_group(child, child.stop_signal)
        # A second Ctrl+C means "now": skip the rest of the grace period.
        if self._wait_groups_gone(self.stop_grace_seconds, lambda: self.signals_received > signals_before):
            return
        for child in started:
            if self.group_alive(child):
                self.out(f"gpuadmin: {child.name} did not stop in time; sending SIGKILL to its process group")
                self._signal_group(child, signal.SIGKILL)
        if not self._wait_groups_gone(KILL_WAIT_SECONDS):
            left = [c.name for c in started if self.group_alive(c)]
            self.out(f"gpuadmin: processes of {', '.join(left)} are still there after SIGKILL (state D?)")

    # --- the main loop ---------------------------------------------------------
    def run(self, ready_url: str | None = None, ready_message: str = "") -> int:
        """Start the children and watch them until a stop signal or a death; returns the exit status."""
        self.install_signal_handlers()
        try:
            for child in self.children:
                if self.stop_requested is not None:
                    break
                self.start(child)
            self.publish_state()
            is_ready = ready_url is None
            ready_deadline = time.monotonic() + READY_TIMEOUT_SECONDS
            next_check = 0.0
            while self.stop_requested is None:
                self.reap()
                now = time.monotonic()
                for child in self.children:
                    just_died = child.pid and child.exit_status is not None and child.restart_due is None
                    if just_died and not child.restart:
                        self.out(f"gpuadmin: {child.name} {child.describe_exit()}; not restarted")
                        child.restart_due = math.inf  # reported once; its process group is left as it is
                        continue
                    if just_died and not self.on_unexpected_exit(child, now):
                        return 1
                    self.restart_if_due(child, now)
                if not is_ready and now >= next_check:
                    next_check = now + 0.5
                    if http_ok(str(ready_url)):
                        is_ready = True
                        self.out(ready_message)
                    elif now > ready_deadline:
                        self.out(f"gpuadmin: {ready_url} did not answer within {READY_TIMEOUT_SECONDS:.0f} s")
                        return 1
                time.sleep(POLL_SECONDS)
            name = signal.Signals(self.stop_requested).name
            self.out(f"gpuadmin: {name} received; stopping {', '.join(c.name for c in self.children)}")
            return 0
        finally:
            self.stop_all()
            self.remove_state()
            self.out("gpuadmin: stopped")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (our own http://127.0.0.1 URL)
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        # Not fatal: orphans then go to PID 1, which reaps them on a normal system.
        reason = os.strerror(ctypes.get_errno())
        print(f"gpuadmin: cannot become a child subreaper: {reason}", file=sys.stderr)


def port_from_env(environ: dict[str, str]) -> int:
    raw = environ.get("PORT") or str(DEFAULT_PORT)
    try:
        port = int(raw)
    except ValueError:
        raise StartupError(f"PORT must be a number, got {raw!r}") from None
    if not 0 < port < 65536:
        raise StartupError(f"PORT must be between 1 and 65535, got {port}")
    return port


def check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((BIND_ADDRESS, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(f"{BIND_ADDRESS}:{port} is in use; choose another with PORT=...") from None
            raise StartupError(f"cannot listen on {BIND_ADDRESS}:{port}: {exc.strerror}") from None


def prepare_database() -> tuple[str, Path]:
    """Migrate and make sure an admin exists; returns this host's name (for its queue) and the data dir."""
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    django.setup()
    call_command("migrate", interactive=False, verbosity=1)
    # The hashed, compressed static files the pages name (settings.STORAGES), fresh at every start.
    call_command("collectstatic", interactive=False, verbosity=0)
    call_command("ensure_admin")
    # This box's own agent is trusted from the start: its key lies in our own data directory.
    from gpuadmin.keys import agent_signing_key
    from gpuadmin.wire.signing import public_key_text

    call_command("accept_host", settings.GPUADMIN_HOST_NAME, public_key=public_key_text(agent_signing_key()))
    connections.close_all()  # the children open their own
    return settings.GPUADMIN_HOST_NAME, Path(settings.DATA_DIR)


def build_children(python: str, port: int, host_name: str, environ: dict[str, str]) -> list[Child]:
    from gpuadmin.celery import CENTRAL_QUEUE, host_queue

    concurrency = environ.get("GPUADMIN_WORKER_CONCURRENCY") or str(DEFAULT_WORKER_CONCURRENCY)
    web = Child("web server (gunicorn)", [
        python, "-m", "gunicorn", "gpuadmin.wsgi:application",
        "--bind", f"{BIND_ADDRESS}:{port}",
        "--workers", "2", "--worker-class", "gthread", "--threads", "4",
        "--graceful-timeout", str(int(STOP_GRACE_SECONDS) - 2),
        "--access-logfile", "-",
        "--no-control-socket",  # gunicorn >= 27 would otherwise open one under $HOME
    ])
    worker = Child("worker (celery, with scheduler)", [
        python, "-m", "celery", "-A", "gpuadmin.agent.worker", "worker",  # both roles
        "-Q", f"{CENTRAL_QUEUE},{host_queue(host_name)}",
        "-B", "--concurrency", concurrency, "--loglevel", "INFO",
        # One worker on one box has nobody to gossip with; on the filesystem
        # broker these fan-out messages would pile up for workers that died.
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ])
    return [web, worker]


def configure_demo_gpus(environ: MutableMapping[str, str]) -> Path | None:
    """With the simulated backend and no file named, simulate two GPUs whose memory moves over time,
    part of it held by this supervisor (a process that lives exactly as long as ``make run``)."""
    if environ.get("GPUADMIN_GPU_BACKEND") != "simulated" or environ.get("GPUADMIN_SIMULATED_GPUS"):
        return None
    path = data_dir() / DEMO_SIMULATED_GPUS
    path.write_text(json.dumps(simulated.demo_document(os.getpid()), indent=1))
    environ["GPUADMIN_SIMULATED_GPUS"] = str(path)
    return path


class Scenario(Protocol):
    """What a caller adds to `make run` (``gpuadmin.demo.scenario`` for `make demo`): the supervisor
    calls it, never imports it."""

    def configure(self, environ: MutableMapping[str, str]) -> None: ...

    def prepare_files(self) -> None: ...

    def prepare(self) -> list[str]: ...

    def children(self) -> list[Child]: ...

    def ready_message(self, url: str, host_name: str, lines: list[str]) -> str: ...


DEMO_FLAG = "--demo"


def main(argv: list[str] | None = None, *, scenario: Scenario | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if DEMO_FLAG in argv and scenario is None:
        # `make demo` is its own program (python -m gpuadmin.demo), which calls this supervisor with
        # its scenario; the same process (and pid) goes on as that program.
        rest = [arg for arg in argv if arg != DEMO_FLAG]
        os.execv(sys.executable, [sys.executable, "-m", "gpuadmin.demo", *rest])  # noqa: S606
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    os.environ.setdefault("GPUADMIN_GPU_BACKEND", "auto")  # this host's live data
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.chdir(BASE_DIR)
    if scenario is not None:
        scenario.configure(os.environ)
    scenario_lines: list[str] = []
    try:
        port = port_from_env(dict(os.environ))
        check_port_free(port)
        prepare_data_dir()  # before anything loads the settings: they only read what it makes
        if problem := exposure():
            raise StartupError(problem)
        if scenario is not None:
            scenario.prepare_files()
        else:
            configure_demo_gpus(os.environ)
        host_name, data_folder = prepare_database()
        if scenario is not None:
            scenario_lines = scenario.prepare()
    except StartupError as exc:
        print(f"gpuadmin: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpuadmin: interrupted before start", file=sys.stderr)
        return 130
    become_subreaper()
    environ = dict(os.environ)
    children = build_children(sys.executable, port, host_name, environ)
    if scenario is not None:
        children += scenario.children()
    supervisor = Supervisor(children, environ, out=lambda line: print(line, flush=True),
                            state_path=supervisor_state_path(data_folder))
    url = f"http://{BIND_ADDRESS}:{port}/"
    ready = f"gpuadmin is running at {url} (host {host_name}); press Ctrl+C to stop"
    if scenario is not None:
        ready = scenario.ready_message(url, host_name, scenario_lines)
    return supervisor.run(ready_url=f"{url}login/", ready_message=ready)


if __name__ == "__main__":
    sys.exit(main())
