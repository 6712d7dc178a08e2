"""What central knows about the fleet: hosts, their GPUs, the latest snapshot,
history, and the findings drawn from it.

History is kept proportional to what matters: a row per GPU and one per host
when a figure moved past its step (at least once a minute), and one row per
*life* of a process that mattered (GPU holder, device holder, zombie, D state)
— never one row per process per snapshot.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Count, OuterRef, Prefetch, Q, Subquery, TextField
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from gpuadmin.fleet.process_tree import ProcessRow, current_process_rows, process_rows
from gpuadmin.fleet.storage.json_text import JsonTextField, decode_document
from gpuadmin.fleet.taken_at import document_taken_at
from gpuadmin.wire.snapshot_update import overlay

# The read side's queries, named once (as NetBox's querysets and healthchecks'
# model methods do): pages, API and the kills app call these instead of
# retyping filters.


def awaiting_acceptance_q() -> Q:
    """A host that offered a key no approver has accepted yet (docs/security.md), as a condition.

    A condition on the host's own columns, not a subquery of keys: counted in one
    aggregate (the fleet page's summary) and negated by ``fleet()`` without a
    NOT IN over the hosts table in every fleet query.
    """
    return ~Q(public_key="") & Q(key_accepted_at__isnull=True)


def online_q(now: datetime) -> Q:
    """A host seen within the offline window at ``now`` (``Host.is_online``), as a condition: its
    negation (``exclude``, ``~``) is offline, never seen included, in the same pass over the hosts."""
    return Q(last_seen_at__gte=now - Host.offline_after())


class HostQuerySet(models.QuerySet):
    def lock_in_id_order(self, host_ids: Sequence[int]) -> list[int]:
        """Lock these hosts' rows, in id order, in the caller's transaction; the ids found.

        Every transaction that writes for several hosts takes their row locks first, and in this one
        order (a batch of snapshot updates, ``fleet.intake.updates``, by name but ordered by id; beat's
        history roll-ups; the usage ledger's settling), so that none can wait on another in a cycle:
        a roll-up batch that locked hosts as its writes reached them deadlocked with a settling."""
        locked = self.select_for_update().filter(pk__in=host_ids).order_by("pk")
        return list(locked.values_list("pk", flat=True))

    def awaiting_acceptance(self) -> HostQuerySet:
        """Hosts that offered a key no approver has accepted yet (docs/security.md)."""
        return self.filter(awaiting_acceptance_q())

    def fleet(self) -> HostQuerySet:
        """Every host but those awaiting acceptance: nothing of those is fleet data."""
        return self.exclude(awaiting_acceptance_q())

    def with_open_finding_counts(self) -> HostQuerySet:
        """Each host with ``open_findings_<severity>`` counts, one correlated subquery each.

        Subqueries, not a join and a GROUP BY over every host column: a page of hosts
        costs a few index probes per host (the (host, resolved_at) index), and years of
        resolved findings cost nothing.
        """
        open_of_host = _open_findings_of_outer_host()
        return self.annotate(**{
            f"open_findings_{severity.value}": Coalesce(
                Subquery(open_of_host.filter(severity=severity.value).annotate(n=Count("pk")).values("n")), 0
            )
            for severity in Finding.Severity
        })

    def for_listing(self) -> HostQuerySet:
        """Fleet hosts with their present GPUs and open-finding counts, in two queries.

        Each host gets ``present_gpus`` (list, by index) and ``open_findings_<severity>``
        counts (``with_open_finding_counts``), so listing N hosts never loads a snapshot
        document or runs a query per host. Hosts awaiting acceptance are left out
        (``fleet()``).
        """
        present = Prefetch("gpus", queryset=Gpu.objects.filter(present=True).order_by("index"),
                           to_attr="present_gpus")
        return self.fleet().with_open_finding_counts().prefetch_related(present)

    def named(self, name: str) -> Host | None:
        return self.filter(name=name).first()

    def online(self, now: datetime | None = None) -> HostQuerySet:
        """Hosts seen within the offline window (``Host.is_online`` as a query)."""
        return self.filter(online_q(now or timezone.now()))

    def offline(self, now: datetime | None = None) -> HostQuerySet:
        """Hosts not seen within the offline window, never seen included (``online``'s complement)."""
        return self.exclude(online_q(now or timezone.now()))

    def with_open_finding(self, kind: str) -> HostQuerySet:
        """Hosts with an open finding of ``kind``."""
        return self.filter(pk__in=Finding.objects.open().filter(kind=kind).values("host_id"))


class Host(models.Model):
    name = models.CharField(max_length=253, unique=True)
    first_seen_at = models.DateTimeField(default=timezone.now)
    # When central last stored a snapshot (its clock), and when the host took it (its clock).
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_snapshot_taken_at = models.DateTimeField(null=True, blank=True)
    boot_id = models.CharField(max_length=64, blank=True)
    kernel = models.CharField(max_length=256, blank=True)
    driver_version = models.CharField(max_length=64, blank=True)
    pid_max = models.PositiveIntegerField(null=True, blank=True)
    pids_in_use = models.PositiveIntegerField(null=True, blank=True)
    process_count = models.PositiveIntegerField(default=0)
    zombie_count = models.PositiveIntegerField(default=0)
    gpu_process_count = models.PositiveIntegerField(default=0)
    gpu_backend_name = models.CharField(max_length=16, blank=True)
    gpu_backend_available = models.BooleanField(default=False)
    gpu_backend_reason = models.CharField(max_length=1024, blank=True)
    # The last rejected snapshot's error, shown on the host page until a good one arrives.
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    # The host's Ed25519 key (docs/security.md, gpuadmin/fleet/intake/trust.py): offered by its
    # first signed snapshot, trusted once an approver accepted it. Until then nothing it
    # sends is stored and no order is sent to it; afterwards only what this key signed counts.
    public_key = models.CharField(max_length=100, blank=True)
    key_fingerprint = models.CharField(max_length=80, blank=True)
    key_offered_at = models.DateTimeField(null=True, blank=True)
    key_accepted_at = models.DateTimeField(null=True, blank=True)
    key_accepted_by_name = models.CharField(max_length=150, blank=True)
    # Messages naming this host that were not signed by its accepted key (forged, altered...).
    rejected_message_count = models.PositiveIntegerField(default=0)
    last_rejected_message_at = models.DateTimeField(null=True, blank=True)
    last_rejected_message_reason = models.TextField(blank=True)
    # Signed "order refused" reports from this host (fleet.intake.trust.count_order_refusal): all of them, and
    # those since the last one written to the audit log that were not (repeats, or over the bound).
    order_refusal_count = models.PositiveIntegerField(default=0)
    order_refusals_unwritten_count = models.PositiveIntegerField(default=0)
    # When the newest snapshot had more processes worth a history of their own than
    # GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT: how many it had, and how many were kept (0 and 0 otherwise).
    history_processes_mattering_count = models.PositiveIntegerField(default=0)
    history_processes_kept_count = models.PositiveIntegerField(default=0)
    # When someone last pressed "probe now" for this host: at most once per probe interval.
    probe_now_sent_at = models.DateTimeField(null=True, blank=True)
    # Samples taken before this are in the 5-minute rollups (gpuadmin/fleet/history/retention.py),
    # whose buckets are closed: a late snapshot older than it is not stored.
    history_rolled_up_until = models.DateTimeField(null=True, blank=True)
    # The 5-minute rollups before this are in the 30-minute ones (GpuRollupCoarse, HostRollupCoarse).
    history_coarse_rolled_up_until = models.DateTimeField(null=True, blank=True)
    # When central last asked this host for a full snapshot because it could not apply an update
    # (gpuadmin/fleet/intake/updates.py): at most once per probe interval, whatever arrives.
    full_snapshot_requested_at = models.DateTimeField(null=True, blank=True)
    # The host's newest HostSample, as written (gpuadmin/fleet/history/record.py): a snapshot or update
    # writes the next one only when a count moved past its step or this one is GPUADMIN_HISTORY_RAW_SECONDS
    # old; read with the row ingest locks anyway, so the decision costs no query.
    sampled_at = models.DateTimeField(null=True, blank=True)
    sampled_zombie_count = models.PositiveIntegerField(null=True, blank=True)
    sampled_uninterruptible_count = models.PositiveIntegerField(null=True, blank=True)
    sampled_pids_in_use = models.PositiveIntegerField(null=True, blank=True)
    sampled_pid_max = models.PositiveIntegerField(null=True, blank=True)

    objects = HostQuerySet.as_manager()
    # Only on hosts loaded by HostQuerySet.for_listing (its Prefetch's to_attr).
    present_gpus: list[Gpu]

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def offline_after() -> timedelta:
        return timedelta(
            seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS
            * settings.GPUADMIN_OFFLINE_AFTER_INTERVALS
        )

    @property
    def key_accepted(self) -> bool:
        return bool(self.public_key) and self.key_accepted_at is not None

    @property
    def awaiting_acceptance(self) -> bool:
        return bool(self.public_key) and self.key_accepted_at is None

    # Only on hosts the fleet page loads (from HostSummary; 0 = critical) or with_open_finding_counts.
    worst_finding_rank: int
    open_findings_critical: int
    open_findings_warning: int
    open_findings_info: int

    @property
    def is_online(self) -> bool:
        if self.last_seen_at is None:
            return False
        return timezone.now() - self.last_seen_at <= self.offline_after()


# Hosts whose newest snapshots' processes are read together (``LatestSnapshotQuerySet.process_rows_of``).
HOSTS_PER_READ = 200


class LatestSnapshotQuerySet(models.QuerySet):
    def for_host(self, host: Host) -> LatestSnapshot | None:
        """The host's newest accepted snapshot; None before its first."""
        return self.filter(host=host).first()

    def process_rows_of(self, hosts: Sequence[Host]) -> Iterator[tuple[Host, dict[int, ProcessRow]]]:
        """Each of ``hosts`` with a snapshot and its process rows (``process_rows_by_host_id``), in
        order, read ``HOSTS_PER_READ`` hosts at a time: never a whole fleet's processes in memory."""
        per_read = HOSTS_PER_READ
        for first in range(0, len(hosts), per_read):
            batch = hosts[first : first + per_read]
            rows_by_host = self.process_rows_by_host_id({host.pk for host in batch})
            yield from ((host, rows_by_host[host.pk]) for host in batch if host.pk in rows_by_host)

    def process_rows_by_host_id(self, host_ids: Collection[int]) -> dict[int, dict[int, ProcessRow]]:
        """The newest snapshots' process rows of several hosts in one query, keyed by host id, each as
        ``process_rows`` of its current document (``process_tree.current_process_rows``: read from the
        stored texts, the documents' other parts never made into dicts)."""
        as_text = {"document_text": Cast("document", TextField()), "update_text": Cast("update", TextField())}
        texts = self.filter(host_id__in=host_ids).annotate(**as_text).values_list(
            "host_id", "document_text", "update_text")
        by_host: dict[int, dict[int, ProcessRow]] = {}
        for host_id, document, update in texts:
            try:
                by_host[host_id] = current_process_rows(document, update)
            except ValueError:  # stored before validation refused what msgspec does (NaN)
                stored = None if update is None else decode_document(update)
                by_host[host_id] = process_rows(current_document(decode_document(document), stored))
        return by_host

    def document_for(self, host: Host) -> dict[str, Any] | None:
        """Only the document of the host's newest snapshot (None before its first), with its latest
        update laid over it (``LatestSnapshot.current_document``)."""
        row = self.filter(host=host).values_list("document", "update").first()
        return None if row is None else current_document(*row)

    def clock_ahead_at_least(self, host: Host) -> timedelta:
        """How far the host's clock ran ahead of central's (negative: behind) at its newest snapshot.

        The document's own ``taken_at`` (the host's clock; LatestSnapshot.taken_at
        is clamped to its arrival) minus central's ``received_at``. The snapshot
        travelled for a while, so this is a lower bound of the real offset: an
        order's deadline moved by it comes, on the host's clock, no later than
        central's deadline (earlier by the snapshot's transit time, at most its
        expiry). Zero before the first snapshot.
        """
        row = self.filter(host=host).values_list("document", "received_at", "update").first()
        taken_at = document_taken_at(row[2] or row[0]) if row else None
        if row is None or taken_at is None:
            return timedelta(0)
        return taken_at - row[1]

    def documents_by_host_id(self, host_ids: set[int]) -> dict[int, dict[str, Any]]:
        """The newest documents of several hosts in one query, keyed by host id."""
        rows = self.filter(host_id__in=host_ids).values_list("host_id", "document", "update")
        return {host_id: current_document(document, update) for host_id, document, update in rows}


def current_document(document: dict[str, Any], update: dict[str, Any] | None) -> dict[str, Any]:
    """A stored full snapshot as its latest applied update says it is now (itself without one)."""
    return document if update is None else overlay(document, update)


class LatestSnapshot(models.Model):
    """The newest accepted snapshot document of a host, as sent (validated).

    Kept as text, not jsonb (``fleet/storage/json_text.py``): every accepted snapshot
    rewrites it and nothing queries inside it in SQL.
    """

    host = models.OneToOneField(Host, on_delete=models.CASCADE, related_name="latest_snapshot")
    taken_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    document = JsonTextField()
    # Snapshot updates (gpuadmin/fleet/intake/updates.py): the digest of the full snapshot above, which
    # the host's updates name as their base; the sequence number of the last update applied to it; that
    # update (figures since the document: read through current_document), null until one is applied.
    base_digest = models.CharField(max_length=71, blank=True, default="", db_default="")
    update_sequence = models.PositiveBigIntegerField(default=0, db_default=0)
    update = JsonTextField(null=True, blank=True)

    objects = LatestSnapshotQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.host.name} @ {self.taken_at:%Y-%m-%d %H:%M:%S}"

    @property
    def current_document(self) -> dict[str, Any]:
        """The document as the latest update says it is now: what pages show (kill targets read
        ``document``: an update never changes a process's identity)."""
        return current_document(self.document, self.update)


class Gpu(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=128)
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=256, blank=True)
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)
    memory_used_bytes = models.BigIntegerField(null=True, blank=True)
    # Sum of the memory of processes visible on the host; the rest is unattributed.
    memory_attributed_bytes = models.BigIntegerField(default=0)
    utilization_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    # False once a snapshot no longer lists this GPU (removed, or fell off the bus).
    present = models.BooleanField(default=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # Since when visible processes hold memory on it at 0% utilization (the "idle holder" finding).
    idle_since = models.DateTimeField(null=True, blank=True)
    # The GPU's newest GpuSample, as written (gpuadmin/fleet/history/record.py, as Host.sampled_*): the
    # next one is written only when a figure moved past its step or this one is old enough.
    sampled_at = models.DateTimeField(null=True, blank=True)
    sampled_memory_used_bytes = models.BigIntegerField(null=True, blank=True)
    sampled_memory_attributed_bytes = models.BigIntegerField(null=True, blank=True)
    sampled_utilization_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    sampled_temperature_celsius = models.SmallIntegerField(null=True, blank=True)
    sampled_power_draw_milliwatts = models.BigIntegerField(null=True, blank=True)
    sampled_power_limit_milliwatts = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["host", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "uuid"], name="gpu_unique_per_host")]

    def __str__(self) -> str:
        return f"{self.host.name} GPU {self.index}"

    @property
    def memory_unattributed_bytes(self) -> int:
        if self.memory_used_bytes is None:
            return 0
        return max(0, self.memory_used_bytes - self.memory_attributed_bytes)


class GpuSample(models.Model):
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    taken_at = models.DateTimeField()
    memory_used_bytes = models.BigIntegerField(null=True)
    memory_attributed_bytes = models.BigIntegerField(default=0)
    utilization_percent = models.PositiveSmallIntegerField(null=True)
    # The snapshot's gpus[].health (docs/snapshot.md), in its units; null when the GPU did not say.
    temperature_celsius = models.SmallIntegerField(null=True)
    power_draw_milliwatts = models.BigIntegerField(null=True)
    power_limit_milliwatts = models.BigIntegerField(null=True)

    class Meta:
        indexes = [models.Index(fields=["gpu", "taken_at"])]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.taken_at:%Y-%m-%d %H:%M:%S}"

    @property
    def memory_unattributed_bytes(self) -> int:
        if self.memory_used_bytes is None:
            return 0
        return max(0, self.memory_used_bytes - self.memory_attributed_bytes)


class HostSample(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="samples")
    taken_at = models.DateTimeField()
    process_count = models.PositiveIntegerField()
    zombie_count = models.PositiveIntegerField()
    uninterruptible_count = models.PositiveIntegerField()
    pids_in_use = models.PositiveIntegerField()
    pid_max = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["host", "taken_at"])]

    def __str__(self) -> str:
        return f"{self.host} @ {self.taken_at:%Y-%m-%d %H:%M:%S}"


class ProcessLifeQuerySet(models.QuerySet):
    def identified(self, host: Host, pid: int, start_time_ticks: int) -> ProcessLife | None:
        """The life of (pid, start time) on the host; of its newest boot should both recur."""
        lives = self.filter(host=host, pid=pid, start_time_ticks=start_time_ticks)
        life = lives.order_by("-last_seen_at").first()
        if life is not None:
            life.host = host  # the caller's row: latest_sighting_at() and the pages read no second one
        return life

    def left_by_launcher(self, host: Host) -> ProcessLifeQuerySet:
        """The host's processes still alive (open lives of its current boot) that a snapshot showed
        outliving their launcher (``launcher_pid``), by pid."""
        return self.filter(host=host, boot_id=host.boot_id, gone_at__isnull=True,
                           launcher_pid__isnull=False).order_by("pid")


class ProcessLife(models.Model):
    """One process that mattered, from the first snapshot that saw it to the last.

    Identity is (host, boot id, pid, start time): a reused PID starts a new life.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="process_lives")
    boot_id = models.CharField(max_length=64)
    pid = models.PositiveIntegerField()
    start_time_ticks = models.BigIntegerField()
    ppid = models.PositiveIntegerField(default=0)
    uid = models.PositiveIntegerField(null=True, blank=True)
    user = models.CharField(max_length=256, blank=True)
    name = models.CharField(max_length=256, blank=True)
    cmdline = models.JSONField(default=list)
    container_id = models.CharField(max_length=128, blank=True)
    # The snapshot's owner block (job, container, pod, unit), as last seen; null when none was recognised.
    owner = models.JSONField(null=True, blank=True)
    # A digest of the seven values above (ppid to owner) as last written (history.description_digest):
    # ingest compares it, not them, to tell a steady life. Null on lives written before it existed.
    description_digest = models.BigIntegerField(null=True, blank=True)
    # Its parent's command line (as shown: its name in brackets when it has none; clipped) and user as
    # the snapshot that last wrote the life showed them ("" when that snapshot did not have the
    # parent): written with the life, never compared, so a parent that exec()s without the life
    # changing is not seen until the life is written again.
    parent_name = models.CharField(max_length=256, blank=True, default="", db_default="")
    parent_user = models.CharField(max_length=256, blank=True, default="", db_default="")
    # The launcher it outlived: its parent before the snapshot that first showed it re-parented and
    # left behind (``orphaned``), as last written (parent_name, parent_user), and between which two
    # snapshots that parent went away. Null when no snapshot showed the process losing its parent.
    launcher_pid = models.PositiveIntegerField(null=True, blank=True)
    launcher_name = models.CharField(max_length=256, blank=True, default="", db_default="")
    launcher_user = models.CharField(max_length=256, blank=True, default="", db_default="")
    launcher_exited_after = models.DateTimeField(null=True, blank=True)
    launcher_exited_before = models.DateTimeField(null=True, blank=True)
    first_seen_at = models.DateTimeField()
    # Exact once the life is gone; while it is open, when a snapshot last wrote it (a steady life is not
    # rewritten, fleet.history.record): ask latest_sighting_at().
    last_seen_at = models.DateTimeField()
    # Set by the first snapshot of the same boot that no longer has this process.
    gone_at = models.DateTimeField(null=True, blank=True)
    last_state = models.CharField(max_length=1, blank=True)
    last_gpu_memory_bytes = models.BigIntegerField(default=0)
    peak_gpu_memory_bytes = models.BigIntegerField(default=0)
    held_device = models.BooleanField(default=False)
    was_zombie = models.BooleanField(default=False)
    was_orphaned = models.BooleanField(default=False)
    # The newest ProcessPoint's values: a new point is stored only when these change enough.
    point_gpu_memory_bytes = models.BigIntegerField(null=True, blank=True)
    point_state = models.CharField(max_length=1, blank=True)
    # Snapshots in a row in which its GPU memory rose without falling, since when and from
    # what (the "suspected leak" finding); a fall starts the count again.
    memory_rising_samples = models.PositiveIntegerField(default=0)
    memory_rising_since = models.DateTimeField(null=True, blank=True)
    memory_rising_from_bytes = models.BigIntegerField(default=0)

    objects = ProcessLifeQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["host", "boot_id", "pid", "start_time_ticks"], name="process_life_identity"
            )
        ]
        indexes = [models.Index(fields=["host", "gone_at"])]

    def __str__(self) -> str:
        return f"{self.host.name}:{self.pid} ({self.name})"

    def latest_sighting_at(self) -> datetime:
        """When a snapshot last showed this process. An open life is in every snapshot of its host,
        so that is the host's newest (its stored last_seen_at is when it was last written)."""
        newest = self.host.last_snapshot_taken_at if self.gone_at is None else None
        return max(self.last_seen_at, newest) if newest else self.last_seen_at


class ProcessPoint(models.Model):
    """A process's GPU memory and state when they changed (not every snapshot): a steady process
    costs one point. The life's last_seen_at / last_gpu_memory_bytes / last_state end the series."""

    life = models.ForeignKey(ProcessLife, on_delete=models.CASCADE, related_name="points")
    taken_at = models.DateTimeField()
    gpu_memory_bytes = models.BigIntegerField()
    state = models.CharField(max_length=1)

    class Meta:
        indexes = [models.Index(fields=["life", "taken_at"])]

    def __str__(self) -> str:
        return f"{self.life} @ {self.taken_at:%Y-%m-%d %H:%M:%S}"


# Rollups: one row per GPU (or host) per 5-minute bucket, numbered as Unix time // 300,
# so coarser charts group them in SQL (bucket / n) on SQLite and PostgreSQL alike.
# The pair is the primary key: no surrogate id and no second index, which is most
# of what a row would otherwise cost (benchmarks/history.py).


class GpuRollup(models.Model):
    """One GPU's samples in one 5-minute bucket: min, mean and max.

    Memory is kept in MiB and the mean utilization in tenths of a percent: charts
    never need finer, and it makes the row 40% smaller than bytes and a float
    would (the bytes per host-day are what bounds the database; benchmarks/history.py).
    The max is rounded up and the min down, so a rollup never hides a peak.
    """

    pk = models.CompositePrimaryKey("gpu", "bucket")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="rollups")
    bucket = models.IntegerField()
    sample_count = models.PositiveSmallIntegerField()
    memory_used_min_mib = models.IntegerField(null=True)
    memory_used_mean_mib = models.IntegerField(null=True)
    memory_used_max_mib = models.IntegerField(null=True)
    memory_attributed_min_mib = models.IntegerField()
    memory_attributed_mean_mib = models.IntegerField()
    memory_attributed_max_mib = models.IntegerField()
    utilization_min_percent = models.SmallIntegerField(null=True)
    utilization_mean_tenths_percent = models.SmallIntegerField(null=True)
    utilization_max_percent = models.SmallIntegerField(null=True)
    # Health (GpuSample's): the mean and the max, the max of the limit; null when no sample said.
    temperature_mean_celsius = models.SmallIntegerField(null=True)
    temperature_max_celsius = models.SmallIntegerField(null=True)
    power_draw_mean_milliwatts = models.IntegerField(null=True)
    power_draw_max_milliwatts = models.IntegerField(null=True)
    power_limit_max_milliwatts = models.IntegerField(null=True)

    def __str__(self) -> str:
        return f"{self.gpu} bucket {self.bucket}"


class HostRollup(models.Model):
    pk = models.CompositePrimaryKey("host", "bucket")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="rollups")
    bucket = models.IntegerField()
    sample_count = models.PositiveSmallIntegerField()
    zombies_min = models.PositiveIntegerField()
    zombies_mean = models.FloatField()
    zombies_max = models.PositiveIntegerField()
    d_state_min = models.PositiveIntegerField()
    d_state_mean = models.FloatField()
    d_state_max = models.PositiveIntegerField()
    pids_in_use_min = models.PositiveIntegerField()
    pids_in_use_mean = models.FloatField()
    pids_in_use_max = models.PositiveIntegerField()
    pid_max = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.host} bucket {self.bucket}"


# The coarse tier, as round-robin time-series stores keep one: the same columns as GpuRollup /
# HostRollup over 30-minute buckets (Unix time // 1800), built from six 5-minute rollups once
# they are all closed (retention.roll_up_coarse). The 5-minute rollups are kept only
# GPUADMIN_HISTORY_FINE_DAYS (the 24-hour chart), these GPUADMIN_HISTORY_DAYS (the 7- and 30-day
# charts): a sixth of the rows for the long keep. Min and max as the fine rows' (no peak hidden),
# sample_count their sum, each mean the mean of the fine means weighted by span: every 5-minute
# rollup present counts for its 5 minutes, whatever its sample count (a steady host may send fewer).
# One column more, fine_bucket_count: how many 5-minute rollups it summarises (1 to 6), the span its
# means weigh in a chart point and the 5-minute buckets with samples a report counts (usage/digest.py).
# Separate tables, not a span column: each tier's day partitions are dropped whole at its own keep.
# The columns are spelled out (a model inheriting them would reorder GpuRollup's); a test holds them
# equal to the fine models' but for that one.


class GpuRollupCoarse(models.Model):
    pk = models.CompositePrimaryKey("gpu", "bucket")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="coarse_rollups")
    bucket = models.IntegerField()
    sample_count = models.PositiveSmallIntegerField()
    fine_bucket_count = models.PositiveSmallIntegerField()
    memory_used_min_mib = models.IntegerField(null=True)
    memory_used_mean_mib = models.IntegerField(null=True)
    memory_used_max_mib = models.IntegerField(null=True)
    memory_attributed_min_mib = models.IntegerField()
    memory_attributed_mean_mib = models.IntegerField()
    memory_attributed_max_mib = models.IntegerField()
    utilization_min_percent = models.SmallIntegerField(null=True)
    utilization_mean_tenths_percent = models.SmallIntegerField(null=True)
    utilization_max_percent = models.SmallIntegerField(null=True)
    temperature_mean_celsius = models.SmallIntegerField(null=True)
    temperature_max_celsius = models.SmallIntegerField(null=True)
    power_draw_mean_milliwatts = models.IntegerField(null=True)
    power_draw_max_milliwatts = models.IntegerField(null=True)
    power_limit_max_milliwatts = models.IntegerField(null=True)

    def __str__(self) -> str:
        return f"{self.gpu} coarse bucket {self.bucket}"


class HostRollupCoarse(models.Model):
    pk = models.CompositePrimaryKey("host", "bucket")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="coarse_rollups")
    bucket = models.IntegerField()
    sample_count = models.PositiveSmallIntegerField()
    fine_bucket_count = models.PositiveSmallIntegerField()
    zombies_min = models.PositiveIntegerField()
    zombies_mean = models.FloatField()
    zombies_max = models.PositiveIntegerField()
    d_state_min = models.PositiveIntegerField()
    d_state_mean = models.FloatField()
    d_state_max = models.PositiveIntegerField()
    pids_in_use_min = models.PositiveIntegerField()
    pids_in_use_mean = models.FloatField()
    pids_in_use_max = models.PositiveIntegerField()
    pid_max = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.host} coarse bucket {self.bucket}"


class FindingQuerySet(models.QuerySet):
    def open(self) -> FindingQuerySet:
        return self.filter(resolved_at__isnull=True)

    def most_severe_first(self) -> list[Finding]:
        """Most severe first, then oldest first (the database cannot order severity by urgency)."""
        return most_severe_first(list(self))


class Finding(models.Model):
    """A diagnosis drawn from a snapshot, with a one-line remedy.

    A finding stays open while each new snapshot still shows it (matched by
    kind + key) and is resolved by the first snapshot that does not.
    """

    class Kind(models.TextChoices):
        ZOMBIES = "zombies", "Zombie processes"
        ORPHAN_GPU = "orphan_gpu", "Orphan holding the GPU"
        UNINTERRUPTIBLE_GPU = "uninterruptible_gpu", "Uninterruptible process holding the GPU"
        UNATTRIBUTED_MEMORY = "unattributed_memory", "Unattributed GPU memory"
        PID_EXHAUSTION = "pid_exhaustion", "PIDs nearly exhausted"
        GPU_DATA_UNAVAILABLE = "gpu_data_unavailable", "GPU data unavailable"
        UNKILLABLE = "unkillable", "Process survived SIGKILL"
        REJECTED_MESSAGES = "rejected_messages", "Messages rejected"
        SUSPECTED_LEAK = "suspected_leak", "Suspected GPU memory leak"
        IDLE_HOLDER = "idle_holder", "GPU memory held while idle"
        PIDS_RUNNING_OUT = "pids_running_out", "PIDs running out"
        GPU_HEALTH = "gpu_health", "GPU health"
        OVER_ATTRIBUTED_MEMORY = "over_attributed_memory", "More GPU memory attributed than used"
        # Opened and closed by the kills app (kills/services/findings.py), never by snapshot syncs.
        MEMORY_NOT_RELEASED = "memory_not_released", "GPU memory not released after a kill"

    class Severity(models.TextChoices):
        INFO = "info", "Info"
        WARNING = "warning", "Warning"
        CRITICAL = "critical", "Critical"

        @property
        def rank(self) -> int:
            """0 for the most urgent: sort keys put critical first."""
            return _SEVERITY_RANKS[self.value]

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="findings")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    # Distinguishes findings of one kind on one host: a parent's pid+start, a GPU uuid...
    key = models.CharField(max_length=200)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    title = models.CharField(max_length=300)
    remedy = models.CharField(max_length=500)
    details = models.JSONField(default=dict)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = FindingQuerySet.as_manager()

    class Meta:
        # Severity is text, so the database cannot order it by urgency; callers
        # sort with Severity.rank (see most_severe_first).
        ordering = ["kind", "key"]
        indexes = [
            models.Index(fields=["host", "resolved_at"]),
            # The fleet page's "open finding of this kind" filter, over every host (fleet.summary's issue 36
            # item 3): only open findings are in it, so years of resolved ones cost nothing.
            models.Index(fields=["kind", "host"], condition=Q(resolved_at__isnull=True),
                         name="fleet_finding_open_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.host.name}: {self.title}"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


_SEVERITY_RANKS = {"critical": 0, "warning": 1, "info": 2}


def _open_findings_of_outer_host() -> models.QuerySet[Finding, dict[str, Any]]:
    """The open findings of the outer query's host, grouped by host: the base of a per-host subquery."""
    return Finding.objects.open().filter(host=OuterRef("pk")).order_by().values("host")


def most_severe_first(findings: list[Finding]) -> list[Finding]:
    return sorted(
        findings,
        key=lambda f: (Finding.Severity(f.severity).rank, f.first_seen_at, f.kind, f.key),
    )


class SnapshotRejection(models.Model):
    """A message central refused (a snapshot, or a kill report that was not its host's), and why.

    Nothing stored changes when one arrives.
    """

    class MessageKind(models.TextChoices):
        SNAPSHOT = "snapshot", "Snapshot"
        KILL_REPORT = "kill_report", "Kill report"
        SNAPSHOT_UPDATE = "snapshot_update", "Snapshot update"

    host_name = models.CharField(max_length=253, blank=True)
    message_kind = models.CharField(max_length=16, choices=MessageKind.choices, default=MessageKind.SNAPSHOT)
    received_at = models.DateTimeField(default=timezone.now)
    size_bytes = models.PositiveIntegerField()
    error = models.TextField()

    class Meta:
        ordering = ["-received_at"]
        indexes = [models.Index(fields=["host_name", "received_at"])]

    def __str__(self) -> str:
        return f"{self.host_name or '?'} rejected at {self.received_at:%Y-%m-%d %H:%M:%S}"


class HostSummary(models.Model):
    """What the fleet page's row and its filters read of one host, kept up to date where it changes
    (``gpuadmin.fleet.summary``): at every snapshot and batch of updates, and wherever a finding opens
    or closes outside ingest. One small row per host, so that sorting, filtering and
    paging 10,000 hosts reads neither snapshots nor GPUs, process lives and findings per host.

    Online or offline is not stored: it is a matter of time (``Host.last_seen_at``).
    """

    host = models.OneToOneField(Host, on_delete=models.CASCADE, primary_key=True, related_name="summary")
    # Present GPUs, in no particular order (a JSON aggregate's): [index, memory_total_bytes,
    # memory_used_bytes, memory_attributed_bytes, utilization_percent], what the row's bars read
    # (``memory_bar``).
    gpus = models.JSONField(default=list)
    gpu_count = models.PositiveIntegerField(default=0)
    free_gpu_count = models.PositiveIntegerField(default=0)
    # The present GPUs' memory, summed (the fleet's totals above the table add these up).
    memory_total_bytes = models.BigIntegerField(default=0)
    memory_used_bytes = models.BigIntegerField(default=0)
    memory_unattributed_bytes = models.BigIntegerField(default=0)  # Gpu.memory_unattributed_bytes, summed
    # The present GPUs' models, each between two GPU_MODELS_SEPARATORs (a filter is one LIKE).
    gpu_models = models.TextField(default="", blank=True)
    orphan_count = models.PositiveIntegerField(default=0)
    top_holder_user = models.CharField(max_length=256, blank=True, default="")
    # That holder's life and memory: what a batch of updates compares the memory it moves with, to
    # recompute the top holder only where it may have changed (``summary.top_holder_may_change``).
    top_holder_life_id = models.BigIntegerField(null=True, blank=True)
    top_holder_memory_bytes = models.BigIntegerField(default=0)
    findings_critical_count = models.PositiveIntegerField(default=0)
    findings_warning_count = models.PositiveIntegerField(default=0)
    findings_info_count = models.PositiveIntegerField(default=0)
    # Severity.rank of the worst open finding; len(Severity) when none is open.
    worst_finding_rank = models.PositiveSmallIntegerField(default=len(_SEVERITY_RANKS))
    worst_finding_severity = models.CharField(max_length=16, blank=True, default="")
    worst_finding_title = models.CharField(max_length=300, blank=True, default="")
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"summary of host {self.host_id}"
