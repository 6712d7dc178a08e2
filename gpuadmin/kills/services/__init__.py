"""The kill workflow's logic; views, API and tasks call these and nothing else.

- requesting: preview and file a request (targets from the latest snapshot)
- decisions: approve, reject, cancel (row-locked)
- dispatch: the order to the host's queue, after the approval commits
- progress: the agent's reports, idempotent per (request, seq)
- sweeping: expiry, re-sends, silent agents
- released: memory confirmed by a later snapshot
"""

from gpuadmin.kills.services.decisions import approve, cancel, may_cancel, may_decide, reject
from gpuadmin.kills.services.dispatch import build_order, send_order
from gpuadmin.kills.services.errors import BadInput, Conflict, KillError, NotAllowed, NotFound, Refused
from gpuadmin.kills.services.progress import EarlierStepsMissing, record_progress
from gpuadmin.kills.services.released import confirm_released
from gpuadmin.kills.services.requesting import file_request, preview
from gpuadmin.kills.services.sweeping import sweep

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
    "may_cancel",
    "may_decide",
    "preview",
    "record_progress",
    "reject",
    "send_order",
    "sweep",
]
