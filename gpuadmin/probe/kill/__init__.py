"""The host-side kill executor: verify and signal the targets of an approved order.

A plain library (no Django, no Celery): the agent's task calls
``execute_order(order, journal=Journal(dir), report=send_to_central)``.
The protocol's words (order versions, events, results) are defined once, in
``protocol.py``; central builds its choices from them. The order format, the
checks and the events are described in docs/kill-order.md.
"""

from gpuadmin.probe.kill.executor import execute_order
from gpuadmin.probe.kill.order import Order, PlanStep, Target, validate_order
from gpuadmin.probe.kill.protocol import Event, Method, Outcome, Refusal, Result, finished_event, parse_event

__all__ = [
    "Event",
    "Method",
    "Order",
    "Outcome",
    "PlanStep",
    "Refusal",
    "Result",
    "Target",
    "execute_order",
    "finished_event",
    "parse_event",
    "validate_order",
]
