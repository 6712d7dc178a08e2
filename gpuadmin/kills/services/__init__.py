"""The kill workflow's logic. Every change to a kill request, its targets and
steps goes through these functions, which also write the audit log in the same
transaction: views, the API, tasks and signal receivers call them (through this
package, not its modules) and never save kill models themselves; they read
the models directly (tests/kills/test_service_contract.py checks this).

- filing: preview and file a request (targets from the latest snapshot), or a GPU reset request
- decisions: approve, reject, cancel (row-locked), and who may do which now
- dispatch: the order to the host's queue, after the approval commits
- progress: the agent's reports, signed by its host's key, idempotent per (request, seq)
- expiry, sweeper: expire what waited too long, re-send, give up on silent agents
- memory_release: memory confirmed by a later snapshot
- findings: the "unkillable" finding, opened and closed
- self_service: a person stopping their own processes, no second admin (checked by uid twice)
- errors: why an action did not happen (pages and API show the message)
"""

from gpuadmin.kills.services.decisions import approve, cancel, may_cancel, may_decide, reject
from gpuadmin.kills.services.dispatch import build_order, send_order
from gpuadmin.kills.services.errors import BadInput, Conflict, KillError, NotAllowed, NotFound, Refused
from gpuadmin.kills.services.filing import (
    file_request,
    file_reset_request,
    get_host,
    get_request,
    open_request_target,
    open_requests_by_process,
    preview,
)
from gpuadmin.kills.services.findings import resolve_gone_unkillable
from gpuadmin.kills.services.memory_release import confirm_released
from gpuadmin.kills.services.progress import EarlierStepsMissing, receive_report, record_progress
from gpuadmin.kills.services.self_service import self_service_refusal, stop_own_processes
from gpuadmin.kills.services.sweeper import sweep

__all__ = [
    "BadInput",
    "Conflict",
    "EarlierStepsMissing",
    "KillError",
    "NotAllowed",
    "NotFound",
    "Refused",
    "approve",
    "build_order",
    "cancel",
    "confirm_released",
    "file_request",
    "file_reset_request",
    "get_host",
    "get_request",
    "may_cancel",
    "may_decide",
    "open_request_target",
    "open_requests_by_process",
    "preview",
    "receive_report",
    "record_progress",
    "reject",
    "resolve_gone_unkillable",
    "self_service_refusal",
    "send_order",
    "stop_own_processes",
    "sweep",
]
