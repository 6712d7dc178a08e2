"""What one fair-use evaluation costs a host, per condition, on PostgreSQL.

Beat runs ``fairuse.evaluate`` every minute; each live policy reads the newest snapshots of the
online hosts in its scope where its condition can hold and looks for it among the processes
(``fairuse/conditions.py``). On a throwaway PostgreSQL (tests/services.py), --hosts synthetic hosts
(``gpuadmin.fleet.synthetic``: 8 GPUs, 200 processes) enrolled through the real path and one round of
full snapshots ingested; then for each condition a live policy over all hosts is evaluated
(``services.evaluate_policy``), alone (the others set to dry run), timed: seconds, and ms a host of
this process's CPU and of its PostgreSQL backend, the first time (its cases opened) and again with
nothing changed (beat's next minute); then "My GPUs" of one person (uid 1000), which reads every
host's processes the same way. A minute's evaluations must fit in a minute: at
N hosts a policy costs about N times the figure a host.

    python benchmarks/fairuse_evaluate.py [--hosts 200] [--no-wait]
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.fleet import database_server_pid, enrolled_fleet, main_over_synthetic_hosts, spent  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return main_over_synthetic_hosts(argv, __doc__.splitlines()[0], "gpuadmin-fairuse-evaluate-", run)


def run(count: int) -> int:
    from gpuadmin.fairuse import conditions, services
    from gpuadmin.fairuse.models import Policy

    logging.disable(logging.WARNING)
    _, now = enrolled_fleet(count, full_rounds=1)
    server = database_server_pid()
    print(f"{count} hosts x 8 GPUs, 200 processes each; one live policy at a time, over all hosts")
    print(f"{'condition':<22} {'in view':>7} {'candidates':>10} {'seconds':>8} {'CPU ms a host':>13} "
          f"{'PostgreSQL ms a host':>20}   (first evaluation, then again with nothing changed)")
    # Idle holders: no GPU of a fleet one round old is marked idle, so no host's processes are read (a
    # host with an idle GPU costs what a host costs too many GPUs).
    for condition in Policy.Condition:
        policy = Policy.objects.create(name=condition.value, condition=condition, mode=Policy.Mode.LIVE,
                                       minutes=60, max_gpus=4)
        in_view = len(conditions.hosts_in_view(policy, now))
        candidates = len(conditions.find(policy, now))
        for run_label in (condition.value, "  again"):
            with spent(server) as cost:
                services.evaluate_policy(policy, now)
            _, client_ms, backend_ms = cost.per_ms(count)
            print(f"{run_label:<22} {in_view:>7} {candidates:>10} {cost.seconds:>8.2f} {client_ms:>13.2f} "
                  f"{backend_ms:>20.2f}")
        policy.mode = Policy.Mode.DRY_RUN
        policy.save(update_fields=["mode"])
        if in_view != count:
            print(f"expected all {count} hosts in view")
            return 1
    return my_gpus(count, now, server)


def my_gpus(count: int, now: Any, server: int | None) -> int:
    """"My GPUs" of one person (``people.processes_of``: every fleet host's processes read for them)."""
    from gpuadmin.fairuse.people import processes_of
    from gpuadmin.notify.models import Account, Person

    person = Person.objects.create(name="Alice")
    Account.objects.create(person=person, uid=1000, name="alice")
    with spent(server) as cost:
        found = len(processes_of(person, now))
    _, client_ms, backend_ms = cost.per_ms(count)
    print(f"{'My GPUs, one person':<22} {count:>7} {found:>10} {cost.seconds:>8.2f} {client_ms:>13.2f} "
          f"{backend_ms:>20.2f}   (candidates: the person's GPU processes)")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
