"""Why a kill workflow action did not happen, as exceptions that pages and the
API turn into a message or a JSON error with the matching HTTP status.
"""

from __future__ import annotations

from typing import Any


class KillError(Exception):
    status_code = 400

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        # More to show with the message (a zombie's parent, the refused descendants...).
        self.extra = extra

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.message, **self.extra}


class BadInput(KillError):
    status_code = 400


class NotAllowed(KillError):
    status_code = 403


class NotFound(KillError):
    status_code = 404


class Conflict(KillError):
    """The request is not in a state that allows this (already approved, final...)."""

    status_code = 409


class Refused(KillError):
    """The rules refuse the target (PID 1, a zombie, protected, not in the snapshot...)."""

    status_code = 422
