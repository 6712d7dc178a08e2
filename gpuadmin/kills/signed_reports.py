"""Kill reports verified again, long after they arrived (``manage.py verify_kill_reports``).

Each step keeps its report as the host signed it: the exact text, the Ed25519
signature and the key that verified it on arrival (``KillStep.signed_text``,
``signature``, ``signer_key``). Whoever can write the database can edit a step;
they cannot sign for the host. A kept report counts only when

- its signature still verifies over its text,
- its key is one the audit log shows accepted for the request's host
  (``host_accepted`` events carry the fingerprint; the audit log itself is
  checked against its signed anchors by ``manage.py verify_audit``), not
  merely the key the host row holds now (a row the same writer can edit), and
- the step's columns are what that text says (request, seq, time, event, PID,
  signal, result, detail, the raw report).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.kills.models import KillStep
from gpuadmin.wire.kill_protocol import BadEvent, parse_event
from gpuadmin.wire.signing import ENVELOPE_VERSION, BadMessage, MessageKind, Opened, open_envelope

# Compared with what the signed text says (``progress.step_columns``).
CHECKED_COLUMNS = ("at", "event", "pid", "signal", "method", "result", "detail", "raw")
NOT_KEPT = "no signed report kept: stored before reports were kept, or its report was removed"


@dataclass(frozen=True)
class Finding:
    step: KillStep
    problem: str

    def __str__(self) -> str:
        return f"request #{self.step.request_id} step {self.step.seq}: {self.problem}"


def envelope(step: KillStep) -> dict[str, Any]:
    """The message as it came off the broker, rebuilt from the step's columns."""
    return {"v": ENVELOPE_VERSION, "kind": MessageKind.KILL_REPORT.value, "text": step.signed_text,
            "key": step.signer_key, "sig": step.signature}


def accepted_fingerprints() -> dict[str, set[str]]:
    """Every key fingerprint the audit log shows accepted, by host name."""
    accepted: dict[str, set[str]] = defaultdict(set)
    for host_name, details_json in (AuditEvent.objects.filter(action=Action.HOST_ACCEPTED)
                                    .values_list("host_name", "details_json")):
        try:
            value = json.loads(details_json).get("fingerprint")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, str):
            accepted[host_name].add(value)
    return accepted


def problem(step: KillStep, accepted: dict[str, set[str]]) -> str | None:
    """Why the kept report does not vouch for this step; None when it does."""
    if not step.signed_text:
        return NOT_KEPT
    opened, why = _opened(step, accepted)
    return why if opened is None else _content_problem(step, opened)


def _opened(step: KillStep, accepted: dict[str, set[str]]) -> tuple[Opened | None, str | None]:
    """The kept report, opened, when its host's accepted key signed it; else why not."""
    try:
        opened = open_envelope(envelope(step), MessageKind.KILL_REPORT, trusted=step.signer_key)
    except BadMessage as error:
        return None, f"the kept report does not verify: {error}"
    host_name = step.request.host.name
    if opened.fingerprint not in accepted.get(host_name, set()):
        return None, (f"signed by {opened.fingerprint}, a key the audit log never shows accepted for "
                      f"{host_name}")
    if step.signer_fingerprint != opened.fingerprint:
        return None, f"the kept fingerprint {step.signer_fingerprint!r} is not the signer's"
    return opened, None


def _content_problem(step: KillStep, opened: Opened) -> str | None:
    """Whether the step's columns are what the signed text says."""
    from gpuadmin.kills.services.progress import step_columns

    try:
        body = opened.body()
        parsed = parse_event(body)
    except (ValueError, BadEvent) as error:
        return f"the signed text is not a kill report: {error}"
    if (parsed.request_id, parsed.seq) != (step.request.order_request_id, step.seq):
        return f"the signed report is step {parsed.seq} of request {parsed.request_id!r}, not this step"
    says = step_columns(parsed, body)
    changed = [name for name in CHECKED_COLUMNS if getattr(step, name) != says[name]]
    return f"{', '.join(changed)} differ from what the host signed" if changed else None


def check_all() -> Iterator[Finding]:
    """Every step whose kept report does not vouch for it, in request and step order."""
    accepted = accepted_fingerprints()
    for step in KillStep.objects.select_related("request__host").order_by("request_id", "seq").iterator():
        found = problem(step, accepted)
        if found is not None:
            yield Finding(step, found)
