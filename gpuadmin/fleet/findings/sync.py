"""Findings stored: a snapshot's drafts (``rules.compute_findings``) become ``Finding`` rows.

Matching is by (kind, key): a finding still drawn is refreshed, a new one opened, one no
longer drawn resolved. Only the kinds snapshots draw (``rules.SNAPSHOT_KINDS``) are touched;
the others belong to other apps. The statements every snapshot runs are compiled once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuadmin.fleet.findings.rules import SNAPSHOT_KINDS, FindingDraft
from gpuadmin.fleet.models import Finding, Host
from gpuadmin.fleet.storage.statements import Param, PendingRows, PreparedQuery, PreparedUpdate


@dataclass(frozen=True)
class SyncResult:
    opened: int
    refreshed: int
    resolved: int
    # The kinds of the host's findings open after the sync: this snapshot's and other apps' (unkillable).
    open_kinds: frozenset[str] = frozenset()


# What a draft sets of its finding besides when it was seen (FindingDraft's attributes of these names).
_DRAFT_FIELDS = ("severity", "title", "remedy", "details")
# The statements every snapshot runs, compiled once (fleet.storage.statements). Open findings are read as
# plain values, unordered, of every kind (picked in Python: a host has few open ones of other kinds).
_OPEN_FINDINGS = PreparedQuery(
    Finding.objects.open().filter(host=Param(Finding, "host")).order_by().values_list(
        "kind", "key", "pk", *_DRAFT_FIELDS
    )
)
_SEEN = PreparedUpdate(
    Finding.objects.open().filter(host=Param(Finding, "host"), kind__in=sorted(SNAPSHOT_KINDS)),
    last_seen_at=Param(Finding, "last_seen_at"),
)
# One open finding rewritten (its details moved: unattributed memory, zombie counts...): one snapshot
# in three of a demo fleet, so compiled once, where bulk_update would build its CASE statement every time.
_REWRITE = PreparedUpdate(
    Finding.objects.filter(pk=Param(Finding, "id")),
    **{name: Param(Finding, name) for name in (*_DRAFT_FIELDS, "last_seen_at")},
)


def sync_findings(host: Host, drafts: Iterable[FindingDraft], now: datetime) -> SyncResult:
    """Open the new findings, refresh those still present, resolve those that vanished.

    Matching is by (kind, key): a finding keeps its first_seen_at for as long as
    consecutive snapshots show it. A resolved finding that comes back opens a
    new row, so the history of each episode stays intact.
    """
    wanted: dict[tuple[str, str], FindingDraft] = {}
    for draft in drafts:
        if draft.kind not in SNAPSHOT_KINDS:
            raise ValueError(f"{draft.kind} findings are not drawn from snapshots")
        wanted[(draft.kind, draft.key)] = draft
    still_open, others = _open_findings(start_reading_open(host.pk))
    created, refreshed, only_seen = [], [], []
    for kind_key, draft in wanted.items():
        fields = {name: getattr(draft, name) for name in _DRAFT_FIELDS}
        pk, stored = still_open.pop(kind_key, (None, None))
        if pk is None:
            created.append(Finding(host=host, kind=draft.kind, key=draft.key, first_seen_at=now,
                                   last_seen_at=now, **fields))
        elif stored == tuple(fields.values()):
            # Most open findings read the same snapshot after snapshot: one UPDATE of last_seen_at.
            only_seen.append(pk)
        else:
            refreshed.append((pk, fields))
    if still_open:
        Finding.objects.filter(pk__in=[pk for pk, _ in still_open.values()]).update(resolved_at=now)
    if created:
        Finding.objects.bulk_create(created)
    for pk, fields in refreshed:
        _REWRITE.run(id=pk, last_seen_at=now, **fields)
    if only_seen:
        # What is still open now is what this snapshot shows: one statement of fixed SQL marks all of it
        # seen (the new and rewritten ones were already), rather than a list of ids.
        _SEEN.run(host=host.pk, last_seen_at=now)
    return SyncResult(
        opened=len(created), refreshed=len(refreshed) + len(only_seen), resolved=len(still_open),
        open_kinds=frozenset(kind for kind, _ in wanted) | others,
    )


def start_reading_open(host_pk: int) -> PendingRows:
    """The open findings of the host ``sync_findings`` reads, asked for now (``PreparedQuery.start``)."""
    return _OPEN_FINDINGS.start(host=host_pk)


def _open_findings(
    pending: PendingRows,
) -> tuple[dict[tuple[str, str], tuple[int, tuple[Any, ...]]], set[str]]:
    """The host's open findings that snapshots draw, by (kind, key): their id and ``_DRAFT_FIELDS``
    values; and the kinds of its other open findings (other apps')."""
    drawn: dict[tuple[str, str], tuple[int, tuple[Any, ...]]] = {}
    others: set[str] = set()
    for kind, key, pk, *stored in pending.rows():
        if kind in SNAPSHOT_KINDS:
            drawn[(kind, key)] = (pk, tuple(stored))
        else:
            others.add(kind)
    return drawn, others
