"""``python -m gpuadmin.demo.driver``: the demo's clockwork, one supervisor child.

Every second it rewrites the simulated GPU file from the live claims (a
process killed through the panel frees its memory at once); every probe
interval it sends each synthetic host's signed snapshot to central, as an
agent would.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

GPU_FILE_EVERY_SECONDS = 1.0


def drop_probe_requests(app: Any, queues: list[str]) -> None:
    """Central may ask a synthetic host for a probe like any host ("probe now", a host just accepted);
    no agent consumes them, so they go here."""
    with app.connection_for_write() as connection:
        for queue in queues:
            connection.default_channel.queue_purge(queue)


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    import django

    django.setup()
    from django.conf import settings

    from gpuadmin.celery import app, host_queue
    from gpuadmin.demo import claims, fleet, scenario
    from gpuadmin.sending import send_snapshot

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    next_fleet = 0.0
    first = True
    while True:
        claims.write_gpu_file(scenario.GPUS)
        now = time.monotonic()
        if now >= next_fleet:
            next_fleet = now + settings.GPUADMIN_PROBE_INTERVAL_SECONDS
            try:
                for message in fleet.signed_documents(first):
                    send_snapshot(message)
                first = False
                drop_probe_requests(app, [host_queue(h.name) for h in fleet.HOSTS])
            except Exception as error:  # a broker hiccup: the next round sends again
                print(f"gpuadmin demo: could not send the synthetic hosts' snapshots: {error}", flush=True)
        time.sleep(GPU_FILE_EVERY_SECONDS)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
