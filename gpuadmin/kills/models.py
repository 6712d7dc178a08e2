"""Kill requests, their exact targets, and the steps the agent reported.

A target is a PID *and* its start time (and the host's boot id): PIDs are
reused, so the pair names one process for its whole life. The statuses and
their allowed changes live in ``states.py``; ``KillRequest.transition`` is the
only place that changes ``status``. The rules that read a request's times
(late, cancellable, when the agent owes its "finished") are methods here, next
to the queries that select by the same rules. The agent's event words come from
``gpuadmin/wire/kill_protocol.py``.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta
from typing import Any, TypeAlias

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpuadmin.fleet.models import Host
from gpuadmin.fleet.process_tree import owner_label
from gpuadmin.kills import plans
from gpuadmin.kills.states import ACTIVE, FINAL, Status, can_correct_by_late_report, check_transition
from gpuadmin.wire import kill_protocol

CMDLINE_PREVIEW_ARGS = 64
CMDLINE_PREVIEW_CHARS = 2048


# The agent reports its start as it happens; a report may still be on its way
# (a busy central queue) for a while after the deadline. Expiring only after
# this margin keeps a request that did start from being called expired.
START_REPORT_MARGIN = timedelta(seconds=30)
# After the plan's last grace period, how long to wait for the agent's "finished".
FINISH_REPORT_MARGIN = timedelta(seconds=60)


# An order's request id as central writes it (``KillRequest.order_request_id``): the
# request's number and its random order key, both required (a bare number could name
# another request's order).
ORDER_REQUEST_ID = re.compile(r"^(?P<pk>[0-9]{1,18})-(?P<key>[0-9a-f]{1,32})$")


def new_order_key() -> str:
    return secrets.token_hex(6)


class KillRequestQuerySet(models.QuerySet):
    def locked(self, pk: int) -> KillRequest:
        """The request (and its host), its row locked until the transaction ends.

        Every change to a request takes this lock first, so two changes (two
        approvers, a report and the sweeper) run one after the other and the
        second sees what the first did. Raises KillRequest.DoesNotExist.
        """
        return self.select_for_update().select_related("host").get(pk=pk)

    def shown(self) -> KillRequestQuerySet:
        """With the host and the targets, which every page and API answer about a request reads."""
        return self.select_related("host").prefetch_related("targets")

    def pending(self) -> KillRequestQuerySet:
        """Requests waiting for an approver's decision (the fleet page counts them)."""
        return self.filter(status=Status.PENDING)

    def late(self, now: datetime) -> KillRequestQuerySet:
        """Requests that waited too long and are to expire: ``KillRequest.is_late`` as a query."""
        return self.filter(
            Q(status=Status.PENDING, pending_expires_at__lte=now)
            | Q(status=Status.APPROVED, start_deadline__lte=now - START_REPORT_MARGIN)
        )


class KillRequest(models.Model):
    # An alias (KillRequest.Status.PENDING), so that annotations in this class body may name it.
    Status: TypeAlias = Status

    class Action(models.TextChoices):
        # The words are the order's "action" (gpuadmin/wire/kill_protocol.py).
        KILL = kill_protocol.Action.KILL.value, "Kill"
        RESET_GPU = kill_protocol.Action.RESET_GPU.value, "GPU reset"

    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="kill_requests")
    # Part of the order's request id ("<pk>-<key>"): the agent's journal answers a
    # request id it has seen with what it recorded, so an id must never repeat,
    # not even after central's database is recreated and primary keys restart.
    order_key = models.CharField(max_length=32, default=new_order_key, editable=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    # A kill (targets and a plan) or the reset of one GPU (no targets, no plan): the same
    # approval, order, signature, journal and audit either way.
    action = models.CharField(max_length=16, choices=Action.choices, default=Action.KILL)
    gpu_uuid = models.CharField(max_length=128, blank=True)
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)

    # Names are copied so the request stays readable after an account is deleted.
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="kill_requests_filed"
    )
    requested_by_name = models.CharField(max_length=150)
    requested_at = models.DateTimeField(default=timezone.now)
    reason = models.TextField()
    plan = models.JSONField(default=plans.default_plan)
    include_descendants = models.BooleanField(default=False)
    # "Every process of job J / container C / pod P on this host": the workload's key
    # (process_tree.Workload.key) and label as filed; blank for a request for one process.
    workload = models.CharField(max_length=100, blank=True)
    workload_label = models.CharField(max_length=300, blank=True)
    # The snapshot the targets were resolved from, and the host's boot then.
    snapshot_taken_at = models.DateTimeField()
    boot_id = models.CharField(max_length=64)
    # Shown with the request: D-state targets, an offline host...
    warnings = models.JSONField(default=list, blank=True)
    # Descendants the rules kept out of the request, with why: [{"pid", "name", "user", "why"}].
    excluded_targets = models.JSONField(default=list, blank=True)
    pending_expires_at = models.DateTimeField()

    # Approval ("SIGKILL only" exists only when the approver allowed it).
    sigkill_only_allowed = models.BooleanField(default=False)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="kill_requests_approved",
    )
    approved_by_name = models.CharField(max_length=150, blank=True)
    self_approved = models.BooleanField(default=False)
    # Filed by a person for their own processes, with no second admin (kills/services/self_service.py):
    # its order is a self-service order, which the agent runs only on processes of the allowed uids.
    self_service = models.BooleanField(default=False)
    # Who rejected or cancelled it.
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="kill_requests_closed",
    )
    closed_by_name = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    # The agent must *start* by then; it is in the order, and the broker drops the message after it.
    start_deadline = models.DateTimeField(null=True, blank=True)

    # Dispatch: null until the broker accepted the order.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    dispatch_attempts = models.PositiveIntegerField(default=0)
    last_dispatch_error = models.TextField(blank=True)

    # Execution, as the agent reported it (the agent's clock; ``start_received_at`` is central's).
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result_detail = models.TextField(blank=True)

    # Memory: what the targets held (per GPU, from the snapshot the approval saw)
    # and what a later snapshot showed came back.
    memory_baseline = models.JSONField(default=dict, blank=True)
    memory_expected_release_bytes = models.BigIntegerField(default=0)
    memory_released_bytes = models.BigIntegerField(null=True, blank=True)
    memory_confirmed_at = models.DateTimeField(null=True, blank=True)
    # Snapshots taken since the kill finished that were compared with the baseline: after
    # GPUADMIN_MEMORY_RELEASE_SNAPSHOTS of them, memory still missing is called not released.
    memory_snapshots_compared = models.PositiveIntegerField(default=0)

    objects = KillRequestQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["status", "requested_at"])]

    def __str__(self) -> str:
        what = "GPU reset request" if self.is_reset else "Kill request"
        return f"{what} #{self.pk} on {self.host.name} ({self.status})"

    @property
    def is_reset(self) -> bool:
        return self.action == self.Action.RESET_GPU

    @property
    def gpu_label(self) -> str:
        """'GPU 0 (GPU-…)' for a reset request; empty for a kill."""
        if not self.is_reset:
            return ""
        if self.gpu_index is None:
            return f"GPU {self.gpu_uuid}"
        return f"GPU {self.gpu_index} ({self.gpu_uuid})"

    @property
    def memory_not_released_bytes(self) -> int:
        """What the kill's targets held and the confirming snapshot did not show back (0 when all came)."""
        if self.memory_confirmed_at is None or self.memory_released_bytes is None:
            return 0
        return max(0, self.memory_expected_release_bytes - self.memory_released_bytes)

    def transition(self, to: Status | str, *, by_report: bool = False) -> None:
        """Move to ``to`` or raise InvalidTransition; the caller saves (in its transaction).

        ``by_report``: the move is what an agent's report shows, which may also correct an
        expiry (``corrects_expiry``); only the progress service says so.
        """
        if not (by_report and self.corrects_expiry(to)):
            check_transition(self.status, to)
        self.status = Status(to)

    def corrects_expiry(self, to: Status | str) -> bool:
        """Whether an agent's report that shows ``to`` disproves this request's expiry.

        Central expired it for want of a "started" report, but its order was out and the agent
        acted on it, so it started in time (it never starts later) and the report came late
        (``states.LATE_REPORT_CORRECTIONS``). A request that expired pending never had an order.
        """
        return self.dispatched_at is not None and can_correct_by_late_report(self.status, to)

    @property
    def order_request_id(self) -> str:
        """The order's request id, ``"<pk>-<order key>"``; ``parse_order_request_id`` reads it back."""
        return f"{self.pk}-{self.order_key}"

    @staticmethod
    def parse_order_request_id(value: Any) -> tuple[int, str]:
        """(primary key, order key) from a reported request id "42-3f9a0c1b2d4e".

        Raises ValueError for anything else, a bare number included.
        """
        match = ORDER_REQUEST_ID.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(
                f"'request_id' must be an order's request id like '42-3f9a0c1b2d4e'; got {value!r:.80}"
            )
        return int(match["pk"]), match["key"]

    @property
    def is_final(self) -> bool:
        return self.status in FINAL

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    def is_late(self, now: datetime) -> bool:
        """Pending past its expiry, or approved and never started (deadline plus the report margin)."""
        if self.status == Status.PENDING:
            return self.pending_expires_at <= now
        return (
            self.status == Status.APPROVED
            and self.start_deadline is not None
            and self.start_deadline + START_REPORT_MARGIN <= now
        )

    @property
    def finish_deadline(self) -> datetime | None:
        """By when the agent owes its "finished" report, on central's clock: the plan's length after
        it began, plus a margin.

        The sweeper compares it with central's clock, so it counts from when central received the
        agent's first report of the run (its "started", unless another overtook it or it was lost),
        not from ``started_at``: that is the agent's clock, and a host clock behind central's would
        fail a kill still in its grace periods (docs/kill-order.md, *Clocks*). Every report left
        after the start, so the deadline is never early. No report yet: from the approval.
        """
        began = self.first_report_received_at or self.decided_at
        if began is None:
            return None
        # A reset has no plan; nvidia-smi may take up to the agent's reset timeout.
        work = kill_protocol.RESET_TIMEOUT_SECONDS if self.is_reset else plans.total_seconds(self.plan)
        return began + timedelta(seconds=work) + FINISH_REPORT_MARGIN

    @property
    def first_report_received_at(self) -> datetime | None:
        """When central received the first of the agent's reports (central's clock); None before any."""
        return self.steps.order_by("received_at").values_list("received_at", flat=True).first()

    @property
    def is_cancellable(self) -> bool:
        """Pending, or approved but not yet sent: once the order left, the host may be acting on it."""
        return self.status == Status.PENDING or (
            self.status == Status.APPROVED and self.dispatched_at is None
        )

    @property
    def approved_at(self) -> datetime | None:
        return self.decided_at if self.approved_by_name else None

    @property
    def plan_text(self) -> str:
        if self.is_reset:
            return f"reset {self.gpu_label}, only if nothing holds it then"
        return plans.describe(self.plan)

    @property
    def is_sigkill_only(self) -> bool:
        return plans.is_sigkill_only(self.plan)

    def process_users(self) -> list[str]:
        return sorted({t.user or str(t.uid) for t in self.targets.all()})


class KillTarget(models.Model):
    class Outcome(models.TextChoices):
        PENDING = "pending", "Not signalled yet"
        SIGNALLED = "signalled", "Signalled"
        EXITED = "exited", "Exited"
        EXITED_NOT_REAPED = "exited_not_reaped", "Exited, not yet reaped by its parent"
        SURVIVED = "survived", "Survived the last step"
        REFUSED = "refused", "Refused by the agent"

    # Outcomes after which the process no longer holds GPU memory.
    GONE = (Outcome.EXITED, Outcome.EXITED_NOT_REAPED)

    request = models.ForeignKey(KillRequest, on_delete=models.CASCADE, related_name="targets")
    pid = models.PositiveIntegerField()
    start_time_ticks = models.BigIntegerField()
    boot_id = models.CharField(max_length=64)
    ppid = models.PositiveIntegerField(default=0)
    uid = models.PositiveIntegerField(null=True, blank=True)
    user = models.CharField(max_length=256, blank=True)
    name = models.CharField(max_length=256, blank=True)
    cmdline_sha256 = models.CharField(max_length=64)
    # A preview for people; the digest above is what identifies the process.
    cmdline = models.JSONField(default=list)
    cmdline_truncated = models.BooleanField(default=False)
    state = models.CharField(max_length=1, blank=True)
    # Per GPU uuid, as the request's snapshot showed it.
    gpu_memory_bytes = models.JSONField(default=dict)
    is_descendant = models.BooleanField(default=False)
    # The snapshot's owner block (job, container, pod, unit) when the request was filed.
    owner = models.JSONField(null=True, blank=True)
    outcome = models.CharField(max_length=20, choices=Outcome.choices, default=Outcome.PENDING)
    outcome_detail = models.TextField(blank=True)
    last_signal = models.CharField(max_length=8, blank=True)

    class Meta:
        ordering = ["request", "is_descendant", "pid"]
        constraints = [
            models.UniqueConstraint(fields=["request", "pid", "start_time_ticks"], name="kill_target_once")
        ]

    def __str__(self) -> str:
        return f"{self.pid} {self.name}"

    @property
    def total_gpu_memory_bytes(self) -> int:
        return sum(v for v in self.gpu_memory_bytes.values() if v)

    @property
    def command_line(self) -> str:
        text = " ".join(self.cmdline) if self.cmdline else f"[{self.name}]"
        return text + (" …" if self.cmdline_truncated else "")

    @property
    def owner_label(self) -> str:
        return owner_label(self.owner)

    @property
    def is_gone(self) -> bool:
        return self.outcome in self.GONE


class KillStep(models.Model):
    """One event the agent reported; stored once per (request, seq) however often it arrives."""

    # The words and labels are the protocol's; a new event is added there.
    # mypy reads the functional enum API only for enum's own classes, not Django's Choices.
    Event = models.TextChoices(  # type: ignore[call-overload]
        "Event", kill_protocol.Event.members(), module=__name__, qualname="KillStep.Event"
    )

    request = models.ForeignKey(KillRequest, on_delete=models.CASCADE, related_name="steps")
    target = models.ForeignKey(
        KillTarget, on_delete=models.SET_NULL, null=True, blank=True, related_name="steps"
    )
    seq = models.PositiveIntegerField()
    # The agent's clock; received_at is central's.
    at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    event = models.CharField(max_length=20, choices=Event.choices)
    pid = models.PositiveIntegerField(null=True, blank=True)
    signal = models.CharField(max_length=8, blank=True)
    method = models.CharField(max_length=8, blank=True)
    result = models.CharField(max_length=16, blank=True)
    detail = models.TextField(blank=True)
    raw = models.JSONField(default=dict)
    # The report as the host signed it, kept so it can be verified again later
    # (gpuadmin/kills/signed_reports.py, manage.py verify_kill_reports): the exact
    # signed text, the Ed25519 signature, and the key that verified it on arrival.
    # Empty for steps stored before reports were kept.
    signed_text = models.TextField(blank=True)
    signature = models.CharField(max_length=100, blank=True)
    signer_key = models.CharField(max_length=100, blank=True)
    signer_fingerprint = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["request", "seq"]
        constraints = [models.UniqueConstraint(fields=["request", "seq"], name="kill_step_once_per_seq")]

    def __str__(self) -> str:
        return f"#{self.request_id}.{self.seq} {self.event}"

    @property
    def sent_with_kill(self) -> bool:
        """Sent with the kill() fallback (no pidfds on the host), which the timeline marks."""
        return self.method == kill_protocol.Method.KILL
