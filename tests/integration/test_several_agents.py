"""Three real agents, one central, on PostgreSQL and a real redis-server.

Central is a Celery worker on the `central` queue plus Celery beat (the
kill sweeper; each agent probes on its own clock), both on this test's PostgreSQL
database. Each agent is its own `python -m gpuadmin.agent` process with its
own host name, data directory, signing key and simulated GPU file. On one
machine the agents share a process table, so who acted is proved by the
agents' journals and by the signed reports central stored, not by who died.
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from gpuadmin.accounts.roles import Role
from gpuadmin.celery import host_queue
from gpuadmin.data_dir import AGENT_JOURNAL, prepare_data_dir
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from gpuadmin.probe.journal import Journal
from tests.integration.helpers import GiB, Worker, database_url_for_workers, wait_until, write_gpus
from tests.keys import accept, install_agent_key
from tests.kills.helpers import start_trainer
from tests.people import make_person
from tests.services import RedisServer, stop_process_group

pytestmark = [pytest.mark.services, pytest.mark.postgres,
              pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PROBE_INTERVAL_SECONDS = 2
START_DEADLINE_SECONDS = 4
PLAN = [{"signal": "SIGTERM", "grace_seconds": 3}, {"signal": "SIGKILL", "grace_seconds": 3}]


@dataclass
class Agent:
    name: str
    data_dir: Path
    gpus_file: Path
    env: dict[str, str]
    log_path: Path
    worker: Worker | None = None

    def start(self, generation: int) -> Worker:
        argv = [sys.executable, "-m", "gpuadmin.agent", "--concurrency", "1"]
        self.worker = Worker(self.name, argv, self.env, self.log_path.with_suffix(f".{generation}.log"))
        self.worker.wait_ready()
        return self.worker

    def stop(self) -> None:
        assert self.worker is not None
        stop_process_group(self.worker.process)

    def journal_ids(self) -> set[str]:
        directory = self.data_dir / AGENT_JOURNAL
        return {path.stem for path in directory.iterdir()} if directory.is_dir() else set()


def central_env(redis_url: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update({"REDIS_URL": redis_url, "DATABASE_URL": database_url_for_workers(),
                "GPUADMIN_PROBE_INTERVAL": str(PROBE_INTERVAL_SECONDS),
                "GPUADMIN_APPROVED_START_DEADLINE_SECONDS": str(START_DEADLINE_SECONDS),
                "GPUADMIN_HOST_NAME": f"central-{uuid.uuid4().hex[:6]}"})
    return env


def make_agent(tmp_path: Path, name: str, redis_url: str, holders: dict[int, int]) -> Agent:
    data_dir = tmp_path / name
    prepare_data_dir(data_dir, central=False)
    install_agent_key(data_dir, name)  # the test knows its key, so it can enrol it
    gpus_file = tmp_path / f"{name}-gpus.json"
    write_gpus(gpus_file, holders)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GPUADMIN_", "REDIS_", "DATABASE_"))}
    env.update({
        "GPUADMIN_HOST_NAME": name, "REDIS_URL": redis_url, "GPUADMIN_DATA_DIR": str(data_dir),
        "GPUADMIN_CENTRAL_PUBLIC_KEY": os.environ["GPUADMIN_CENTRAL_PUBLIC_KEY"],
        "GPUADMIN_GPU_BACKEND": "simulated", "GPUADMIN_SIMULATED_GPUS": str(gpus_file),
        "GPUADMIN_PROBE_INTERVAL": str(PROBE_INTERVAL_SECONDS),
    })
    return Agent(name, data_dir, gpus_file, env, tmp_path / f"{name}.log")


def record_of(host_name: str, pid: int) -> dict | None:
    latest = LatestSnapshot.objects.filter(host__name=host_name).first()
    rows = {p["pid"]: p for p in latest.document["processes"]} if latest else {}
    return rows.get(pid)


def test_three_agents_each_act_for_their_own_host_only(
    redis_server: RedisServer, tmp_path: Path, publish_to, settings,
):
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = PROBE_INTERVAL_SECONDS
    settings.GPUADMIN_APPROVED_START_DEADLINE_SECONDS = START_DEADLINE_SECONDS
    publish_to(redis_server.url)
    requester = make_person("rick", Role.REQUESTER)
    approver = make_person("april", Role.APPROVER)
    suffix = uuid.uuid4().hex[:6]
    trainer_b, _ = start_trainer(tmp_path, "ignore-sigint")
    trainer_c, _ = start_trainer(tmp_path, "checkpoint")
    agents = {
        "a": make_agent(tmp_path, f"gpu-a-{suffix}", redis_server.url, {}),
        "b": make_agent(tmp_path, f"gpu-b-{suffix}", redis_server.url, {trainer_b.pid: 4 * GiB}),
        "c": make_agent(tmp_path, f"gpu-c-{suffix}", redis_server.url, {trainer_c.pid: 2 * GiB}),
    }
    a, b, c = agents["a"], agents["b"], agents["c"]
    env = central_env(redis_server.url)
    central = Worker("central", [sys.executable, "-m", "celery", "-A", "gpuadmin", "worker", "-Q", "central",
                                 "-n", f"central-{suffix}@%h", "--concurrency", "1", "--loglevel", "INFO",
                                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                     env, tmp_path / "central.log")
    # Beat's schedule file in the test's directory; beat knows no host names.
    beat = Worker("beat", [sys.executable, "-m", "celery", "-A", "gpuadmin", "beat", "--loglevel", "INFO",
                           "-s", str(tmp_path / "beat-schedule")], env, tmp_path / "beat.log")
    workers = [central, beat]
    try:
        central.wait_ready()
        for agent in agents.values():
            workers.append(agent.start(1))

        # Each agent's start-up snapshot offers its key; none is in the fleet until accepted.
        def offered() -> bool:
            return Host.objects.filter(name__in=[x.name for x in agents.values()]).exclude(
                public_key="").count() == 3

        wait_until("the three agents to offer their keys", offered, workers)
        assert not LatestSnapshot.objects.filter(host__name__in=[x.name for x in agents.values()]).exists()
        for agent in agents.values():
            accept(agent.name)

        def all_online() -> bool:
            hosts = Host.objects.fleet().filter(name__in=[x.name for x in agents.values()])
            return len(hosts) == 3 and all(host.is_online for host in hosts)

        wait_until("the three hosts online", all_online, workers)
        wait_until("B's trainer in B's snapshot", lambda: record_of(b.name, trainer_b.pid), workers)
        record_c = wait_until("C's trainer in C's snapshot", lambda: record_of(c.name, trainer_c.pid),
                              workers)

        # A kill for B: B's agent alone receives and executes it.
        record_b = record_of(b.name, trainer_b.pid)
        assert record_b is not None
        kill_b = services.file_request(requester, host=b.name, pid=trainer_b.pid,
                                       start_time_ticks=record_b["start_time_ticks"], plan=PLAN,
                                       reason="several agents: B's trainer")
        services.approve(kill_b.pk, approver)

        def final_b() -> bool:
            kill_b.refresh_from_db()
            return kill_b.is_final

        wait_until("B's request to finish", final_b, workers)
        assert kill_b.status == Status.SUCCEEDED, (kill_b.result_detail, b.worker and b.worker.log)
        trainer_b.wait(timeout=10)
        order_id = kill_b.order_request_id
        assert order_id in b.journal_ids()
        entry = Journal(b.data_dir / AGENT_JOURNAL).read(order_id)
        assert entry is not None and entry.finished is not None and entry.finished["result"] == "succeeded"
        assert [e["event"] for e in entry.events][:2] == ["started", "signal_sent"]
        assert order_id not in a.journal_ids() and order_id not in c.journal_ids()
        assert a.journal_ids() == set() and c.journal_ids() == set()
        # Every step central stored came in signed by B's key (receive_report checks the signer).
        assert kill_b.steps.count() >= 4
        for agent in (a, c):
            assert agent.worker is not None and order_id not in agent.worker.log
        assert f"kill request {order_id}" in (b.worker.log if b.worker else "")

        # C stops: it goes offline after three intervals; A and B go on being probed.
        c.stop()
        workers.remove(c.worker)  # type: ignore[arg-type]

        def c_offline() -> bool:
            return not Host.objects.get(name=c.name).is_online

        wait_until("C to be offline", c_offline, workers)
        c_last_seen = Host.objects.get(name=c.name).last_seen_at
        seen_before = {x.name: Host.objects.get(name=x.name).last_seen_at for x in (a, b)}

        def a_and_b_probed_since() -> bool:
            return all(Host.objects.get(name=name).last_seen_at > when for name, when in seen_before.items())

        wait_until("A and B probed after C went away", a_and_b_probed_since, workers)
        assert all(Host.objects.get(name=x.name).is_online for x in (a, b))

        # An order for C, approved while C is down, expires; C back after the deadline runs nothing.
        kill_c = services.file_request(requester, host=c.name, pid=trainer_c.pid,
                                       start_time_ticks=record_c["start_time_ticks"], plan=PLAN,
                                       reason="several agents: C is away")
        services.approve(kill_c.pk, approver)

        def expired_c() -> bool:
            kill_c.refresh_from_db()
            return kill_c.status == Status.EXPIRED

        wait_until("C's request to expire", expired_c, workers)
        assert kill_c.dispatched_at is not None  # it was on C's queue, waiting
        workers.append(c.start(2))

        def c_back_and_queue_drained() -> bool:
            host = Host.objects.get(name=c.name)
            queued = redis.Redis.from_url(redis_server.url).llen(host_queue(c.name))
            return host.last_seen_at > c_last_seen and queued == 0

        wait_until("C back and its queue drained", c_back_and_queue_drained, workers)
        kill_c.refresh_from_db()
        assert kill_c.status == Status.EXPIRED
        assert not kill_c.steps.filter(event="started").exists()
        entry_c = Journal(c.data_dir / AGENT_JOURNAL).read(kill_c.order_request_id)
        assert entry_c is None or not any(e.get("event") == "signal_sent" for e in entry_c.events)
        assert trainer_c.poll() is None  # still running: nothing was sent to it
        assert KillRequest.objects.filter(host__name=a.name).count() == 0
        assert a.journal_ids() == set()
    finally:
        for worker in workers:
            stop_process_group(worker.process)
        for trainer in (trainer_b, trainer_c):
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()
