"""The conditions a policy reads from the fleet's newest snapshots: over K GPUs (the newest
holdings are the excess), orphans holding memory, a zombie tree's parent holding memory; scope."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuadmin.fairuse import conditions
from gpuadmin.fairuse.models import Policy
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
