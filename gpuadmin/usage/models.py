"""The usage ledger: who held which GPU, how long, how much of it, and how much of that time it computed.

Three tables, none of them raw history (they outlive it: ``GPUADMIN_USAGE_DAYS``):

- ``LifeUsage``: one row per process life and device it held (a MIG instance is a device of its own),
  its totals over the whole life: the figure behind "which processes" links. A life that runs for a
  month is one row, not thirty.
- ``UsageDay``: the same time added up per UTC day, host, Unix user, owner and device model: what the
  usage page, its CSV and the API read. People are resolved when read (``notify.directory``): a
  mapping added later applies to the past too.
- ``UsageCursor``: per host, the holders its latest snapshot showed and what was added up since the
  last write to the two tables above (``ledger.py``).

Times are integer milliseconds and memory-time integer byte-seconds: sums stay exact.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from gpuadmin.fleet.models import Host

# The counters both ledger tables keep, in this order everywhere (ledger.COUNTERS).
COUNTER_FIELDS = ["held_milliseconds", "held_byte_seconds", "busy_milliseconds", "idle_milliseconds",
                  "unmeasured_milliseconds", "busy_estimated_milliseconds"]


class Counters(models.Model):
    # Memory above GPUADMIN_USAGE_HELD_BYTES on the device.
    held_milliseconds = models.BigIntegerField(default=0)
    held_byte_seconds = models.BigIntegerField(default=0)
    # The process's own utilisation where the snapshot gives it (NVML's per-process samples), else
    # the device's shared among its holders: an estimate (ledger.py says how).
    busy_milliseconds = models.BigIntegerField(default=0)
    # Held while the device computed nothing (0 %).
    idle_milliseconds = models.BigIntegerField(default=0)
    # Held on a device that gave no utilisation (a MIG instance, an old driver): neither busy nor idle.
    unmeasured_milliseconds = models.BigIntegerField(default=0)
    # The part of busy_milliseconds that is the shared estimate, not the process's own figure.
    busy_estimated_milliseconds = models.BigIntegerField(default=0)

    class Meta:
        abstract = True

    @property
    def held_gpu_hours(self) -> float:
        return self.held_milliseconds / 3_600_000

    @property
    def idle_gpu_hours(self) -> float:
        return self.idle_milliseconds / 3_600_000


class LifeUsage(Counters):
    # No index of its own: the unique constraint's starts with it (the ledger is kept small on disk).
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="life_usage", db_index=False)
    # The process life's identity (fleet.ProcessLife's), not a key to it: raw history is pruned first.
    boot_id = models.CharField(max_length=64)
    pid = models.PositiveIntegerField()
    start_time_ticks = models.BigIntegerField()
    device_uuid = models.CharField(max_length=128)
    device_model = models.CharField(max_length=256, blank=True)
    user = models.CharField(max_length=256, blank=True)
    uid = models.PositiveIntegerField(null=True, blank=True)
    owner_label = models.CharField(max_length=200, blank=True)
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["host", "boot_id", "pid", "start_time_ticks", "device_uuid"], name="life_usage_once")]
        indexes = [models.Index(fields=["last_at"])]

    def __str__(self) -> str:
        return f"{self.pid} on {self.device_uuid}"


class UsageDay(Counters):
    day = models.DateField()
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="usage_days", db_index=False)
    user = models.CharField(max_length=256, blank=True)
    owner_label = models.CharField(max_length=200, blank=True)
    device_model = models.CharField(max_length=256, blank=True)
    # Written with every addition (the latest wins): what people are resolved by, with the user name.
    uid = models.PositiveIntegerField(null=True, blank=True)
    owner_kind = models.CharField(max_length=32, blank=True)
    owner_uid = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["host", "day", "user", "owner_label", "device_model"], name="usage_day_once")]
        # Periods are read across hosts, and pruned by day.
        indexes = [models.Index(fields=["day"])]

    def __str__(self) -> str:
        return f"{self.day} {self.user} on {self.device_model}"


class UsageCursor(models.Model):
    """A host's ledger between two writes to LifeUsage and UsageDay (``ledger.py`` says how it is read).

    Kept apart so that a steady snapshot rewrites only the small columns: the holders' list, the
    long one, changes only when a process starts or stops holding a device, and at each settling.
    """

    host = models.OneToOneField(Host, on_delete=models.CASCADE, primary_key=True, related_name="+")
    # The snapshot whose holders the cursor lists, and the UTC day being added up (its midnight).
    taken_at = models.DateTimeField()
    day_start = models.DateTimeField()
    # When LifeUsage and UsageDay were last written from it.
    settled_at = models.DateTimeField()
    # Milliseconds charged since then (capped gaps), on every holder's clock.
    clock_milliseconds = models.BigIntegerField(default=0)
    # JSON text: per device its model, utilisation, holders and running totals since settled_at.
    devices = models.TextField()
    # JSON text: per holder (in identity order) its memory and byte-milliseconds since settled_at.
    holder_bytes = models.TextField()
    # Which holders, by identity, as a digest: equal, the holders' list need not be read.
    holders_digest = models.BigIntegerField()
    # JSON text: the holders, each with the running totals it joined at; and those gone since settled_at.
    holders = models.TextField()
    pending = models.TextField()
    # JSON text: the holders' identities alone, in the same order (ledger.HolderIndex): what an update
    # looks a holder up by, without reading the long list.
    holder_index = models.TextField()

    def __str__(self) -> str:
        return f"usage cursor at {self.taken_at}"


class DigestMessage(models.Model):
    """One weekly usage digest to one destination of one approver, and what became of it.

    Kept here, not as a ``notify.Notification`` (whose rows are each about a kill request or a
    credential change): delivered through the same ``notify.delivery.send`` (email and Apprise).
    """

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        SENDING = "sending", "Sending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    # The digest's first UTC day (it covers seven).
    period_start = models.DateField()
    person = models.ForeignKey("notify.Person", on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="+")
    recipient_name = models.CharField(max_length=200)
    url = models.TextField()  # where it goes (may hold a token: never shown)
    destination = models.CharField(max_length=300)  # the URL with its secrets masked
    subject = models.CharField(max_length=300)
    body = models.TextField()
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Beat firing twice, or a redelivered task, must not send a week's digest twice.
            models.UniqueConstraint(fields=["period_start", "url"], name="usage_digest_once"),
        ]

    def __str__(self) -> str:
        return f"usage digest of {self.period_start} to {self.recipient_name} ({self.status})"
