"""The conditions a policy reads from the fleet's newest snapshots: over K GPUs (the newest
holdings are the excess), orphans holding memory, a zombie tree's parent holding memory; scope."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.fairuse import conditions
from gpuadmin.fairuse.models import Policy
from gpuadmin.fleet import models as fleet_models
from gpuadmin.fleet.models import Host
from gpuadmin.notify.models import Account, Person
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC)


@pytest.fixture
def alice():
    person = Person.objects.create(name="Alice")
    Account.objects.create(person=person, uid=1000)
    return person


def test_more_than_k_gpus_names_the_newest_holdings_as_the_excess(alice):
    deliver(snapshot("gpu01", gpus=[gpu(i, used=GiB) for i in range(3)], processes=[
        proc(4100 + i, uid=1000, elapsed_seconds=1000 - 100 * i, gpu_memory={f"GPU-sim-{i:04d}": GiB})
        for i in range(3)
    ]))
    policy = Policy.objects.create(name="two each", condition=Policy.Condition.TOO_MANY_GPUS, max_gpus=2)
    (found,) = conditions.find(policy, NOW)
    assert found.person == alice and found.key == f"person:{alice.pk}"
    assert found.targets == [[4102, 410200]]  # the one started last
    policy.max_gpus = 3
    assert conditions.find(policy, NOW) == []


def test_orphans_and_zombie_trees_holding_memory(alice):
    deliver(snapshot("gpu01", gpus=[gpu(0, used=3 * GiB)], processes=[
        proc(4200, uid=1000, orphaned=True, pgid=4199, gpu_memory={"GPU-sim-0000": GiB}),
        proc(4300, uid=1000, name="launcher", gpu_memory={"GPU-sim-0000": 2 * GiB}),
        proc(4301, ppid=4300, uid=1000, state="Z", cmdline=[]),
    ]))
    policy = Policy.objects.create(name="leftovers", condition=Policy.Condition.ORPHAN_OR_ZOMBIE)
    found = {c.key: c for c in conditions.find(policy, NOW)}
    assert set(found) == {"gpu01:4200:420000", "gpu01:4300:430000"}
    assert "orphan" in found["gpu01:4200:420000"].summary
    assert "1 zombie(s)" in found["gpu01:4300:430000"].summary


def test_a_policy_for_some_people_sees_only_theirs(alice):
    bob = Person.objects.create(name="Bob")
    Account.objects.create(person=bob, uid=1001)
    deliver(snapshot("gpu01", gpus=[gpu(0, used=2 * GiB)], processes=[
        proc(4200, uid=1000, orphaned=True, pgid=4199, gpu_memory={"GPU-sim-0000": GiB}),
        proc(4210, uid=1001, user="bob", orphaned=True, pgid=4198, gpu_memory={"GPU-sim-0000": GiB}),
    ]))
    policy = Policy.objects.create(name="bob only", condition=Policy.Condition.ORPHAN_OR_ZOMBIE,
                                   scope=Policy.Scope.PEOPLE)
    policy.people.add(bob)
    assert [c.person for c in conditions.find(policy, NOW)] == [bob]


def _reads(monkeypatch) -> list[set[int]]:
    """Record which hosts' processes a find reads, per read."""
    from gpuadmin.fleet.models import LatestSnapshotQuerySet

    read: list[set[int]] = []
    process_rows_by_host_id = LatestSnapshotQuerySet.process_rows_by_host_id

    def reading(self, host_ids):
        read.append(set(host_ids))
        return process_rows_by_host_id(self, host_ids)

    monkeypatch.setattr(LatestSnapshotQuerySet, "process_rows_by_host_id", reading)
    return read


def test_idle_holders_are_looked_for_only_on_hosts_with_a_gpu_idle_long_enough(alice, monkeypatch):
    from gpuadmin.fleet.models import Gpu

    for name in ("gpu01", "gpu02"):
        deliver(snapshot(name, taken_at=NOW, gpus=[gpu(0, used=GiB, utilization_percent=0)], processes=[
            proc(4120, uid=1000, gpu_memory={"GPU-sim-0000": GiB})]), received_at=NOW)
    Gpu.objects.filter(host__name="gpu01").update(idle_since=NOW - timedelta(minutes=90))
    Gpu.objects.filter(host__name="gpu02").update(idle_since=NOW - timedelta(minutes=30))
    read = _reads(monkeypatch)
    policy = Policy.objects.create(name="idle", condition=Policy.Condition.IDLE_HOLDER, minutes=60)
    assert [c.key for c in conditions.find(policy, NOW)] == ["gpu01:4120:412000"]
    gpu01 = Host.objects.get(name="gpu01")
    assert read == [{gpu01.pk}]  # gpu02's GPU has been idle 30 minutes: its snapshot is not read


def test_a_fleet_read_a_host_at_a_time_finds_what_it_finds_read_whole(alice, monkeypatch):
    for n in range(3):
        deliver(snapshot(f"gpu0{n + 1}", gpus=[gpu(0, used=GiB)], processes=[
            proc(4100, uid=1000, elapsed_seconds=1000 - 100 * n, gpu_memory={"GPU-sim-0000": GiB}),
            proc(4200, uid=1000, orphaned=True, pgid=4199, elapsed_seconds=1000 - 100 * n,
                 gpu_memory={"GPU-sim-0000": GiB})]))
    policies = [Policy.objects.create(name="two", condition=Policy.Condition.TOO_MANY_GPUS, max_gpus=2),
                Policy.objects.create(name="leftovers", condition=Policy.Condition.ORPHAN_OR_ZOMBIE)]
    whole = [conditions.find(policy, NOW) for policy in policies]
    read = _reads(monkeypatch)
    monkeypatch.setattr(fleet_models, "HOSTS_PER_READ", 1)
    assert [conditions.find(policy, NOW) for policy in policies] == whole
    assert len(read) == 6 and all(len(hosts) == 1 for hosts in read)
    assert whole[0][0].targets == [[4100, 410000], [4200, 420000]] and whole[0][0].host.name == "gpu03"
    assert len(whole[1]) == 3


def test_each_orphan_is_held_since_its_life_says_in_the_same_few_queries_however_many(alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gpuadmin.fleet.models import ProcessLife

    def orphaned(host: str, count: int) -> None:
        deliver(snapshot(host, gpus=[gpu(0, used=count * GiB)], processes=[
            proc(4200 + n, uid=1000, orphaned=True, pgid=4199, gpu_memory={"GPU-sim-0000": GiB})
            for n in range(count)]))

    orphaned("gpu01", 1)
    policy = Policy.objects.create(name="leftovers", condition=Policy.Condition.ORPHAN_OR_ZOMBIE)
    with CaptureQueriesContext(connection) as one:
        conditions.find(policy, NOW)
    orphaned("gpu02", 3)
    orphaned("gpu03", 2)
    ProcessLife.objects.filter(host__name="gpu02", pid=4201).update(launcher_exited_before=NOW)
    with CaptureQueriesContext(connection) as six:
        found = conditions.find(policy, NOW)
    assert len(six.captured_queries) == len(one.captured_queries)
    lives = {(life.host.name, life.pid): life for life in ProcessLife.objects.select_related("host")}
    assert len(found) == 6
    for candidate in found:
        life = lives[(candidate.host.name, candidate.targets[0][0])]
        assert candidate.since == (life.launcher_exited_before or life.first_seen_at)
    assert {c.since for c in found if c.host.name == "gpu02" and c.targets == [[4201, 420100]]} == {NOW}
