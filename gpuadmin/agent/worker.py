"""The Celery app as a worker that consumes a host's queue loads it (``celery -A gpuadmin.agent.worker``).

It is central's app (``gpuadmin.celery``) with the host-side tasks registered:
``probe_host``, ``execute_kill_order`` and the start-up probe. ``python -m
gpuadmin.agent`` and ``make run``'s worker (both roles on one box) load it;
central's own workers load ``-A gpuadmin``, whose app includes central's tasks
only, so no agent code runs there.
"""

from gpuadmin.agent import killing, probing
from gpuadmin.celery import app

__all__ = ["app", "killing", "probing"]
