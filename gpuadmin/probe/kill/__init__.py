"""The host-side kill executor: verify and signal the targets of an approved order.

A plain library (no Django, no Celery): the agent's task calls
``execute_order(order, journal=Journal(dir), report=send_to_central)``.
The order format, the checks and the events are described in docs/kill-order.md.
"""

from gpuadmin.probe.kill.executor import Event, Method, Outcome, Result, execute_order
from gpuadmin.probe.kill.order import Order, PlanStep, Target, validate_order

__all__ = [
    "Event",
    "Method",
    "Order",
    "Outcome",
    "PlanStep",
    "Result",
    "Target",
    "execute_order",
    "validate_order",
]
