"""python manage.py demo_fleet --hosts N [--gpus 8] [--processes 200] [--follow] [--interval S] [--rounds R]

N synthetic hosts (``gpuadmin/fleet/synthetic.py``) through the real ingest path:
each snapshot is signed with its host's own key and received as a central
worker receives one; a new host offers its key and is accepted by
fingerprint (an audit event). ``--follow`` keeps them alive: a fresh
snapshot per host every ``--interval`` seconds (the probe interval by
default) until interrupted, or for ``--rounds`` rounds.

manage.py points it at the demo's data directory (var/demo/) when GPUADMIN_DATA_DIR is unset
(``gpuadmin/demo/fleet_data_dir.py``); a database without tables is refused with what to do.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from gpuadmin.fleet import synthetic
from gpuadmin.fleet.intake.validation import SnapshotRejected
from gpuadmin.fleet.models import Host


class Command(BaseCommand):
    help = "Create (and with --follow keep alive) synthetic hosts through the signed ingest path."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--hosts", type=int, required=True, help="how many hosts")
        parser.add_argument("--gpus", type=int, default=8, help="GPUs per host (default 8)")
        parser.add_argument("--processes", type=int, default=200,
                            help="processes that matter per host (default 200)")
        parser.add_argument("--prefix", default="demo", help="host names are PREFIX-0000, PREFIX-0001...")
        parser.add_argument("--follow", action="store_true",
                            help="send a fresh snapshot per host each interval")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between rounds with --follow (default: the probe interval)")
        parser.add_argument("--rounds", type=int, default=None,
                            help="with --follow, stop after this many rounds")

    def handle(self, *args: Any, **options: Any) -> None:
        count, gpus, processes = options["hosts"], options["gpus"], options["processes"]
        if count < 1 or gpus < 0 or processes < 1:
            raise CommandError("--hosts and --processes must be at least 1, --gpus at least 0")
        if Host._meta.db_table not in connection.introspection.table_names():
            raise CommandError(
                f"the database in {settings.DATA_DIR} has no tables yet: start `make demo` or `make run` "
                "once (they create them), or set GPUADMIN_DATA_DIR to the data directory of the running panel"
            )
        interval = options["interval"] or float(settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
        hosts = synthetic.demo_hosts(settings.DATA_DIR, count, gpus=gpus, processes=processes,
                                prefix=options["prefix"])
        round_number = 0
        while True:
            began = time.monotonic()
            for host in hosts:
                try:
                    synthetic.send(host, round_number)
                except SnapshotRejected as rejected:
                    raise CommandError(
                        f"{host.name}: {rejected.message} (a host of that name has another key: "
                        f"`manage.py forget_host_key {host.name}`, or use another --prefix)"
                    ) from None
            seconds = time.monotonic() - began
            self.stdout.write(f"round {round_number}: {count} snapshots in {seconds:.1f} s "
                              f"({count / max(seconds, 1e-9):.0f}/s)")
            round_number += 1
            if not options["follow"] or (options["rounds"] is not None and round_number >= options["rounds"]):
                return
            time.sleep(max(0.0, interval - seconds))
