"""The host-side kill executor: verify and signal the targets of an approved order.

A plain library (no Django, no Celery): the agent's task calls
``execute_order(order, journal=Journal(dir), report=send_to_central)``.
The order and the protocol's words (order versions, events, results) are the
wire contract, shared with central: ``gpuadmin.wire.kill_order`` and
``gpuadmin.wire.kill_protocol``. docs/kill-order.md describes the order, the
checks and the events.
"""

from gpuadmin.probe.kill.executor import execute_order

__all__ = ["execute_order"]
