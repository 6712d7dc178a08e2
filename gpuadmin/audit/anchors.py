"""Anchors: the audit chain's head, signed with central's key and kept outside the database.

The chain proves only that the rows agree with each other: whoever can write
the database can edit an event and recompute every later hash. An anchor is
``{sequence, hash, anchored_at}`` of a head this process verified, sealed with
central's Ed25519 signing key (which lives in the data directory, not in the
database), then published where the database's writers cannot edit it:

- appended to ``GPUADMIN_AUDIT_ANCHOR_FILE`` (one JSON line per anchor; in
  production a file owned by another user, ``chattr +a``, or shipped off the
  box), and
- logged on ``gpuadmin.audit.anchors`` (the system journal under systemd; to
  syslog too with ``GPUADMIN_AUDIT_ANCHOR_SYSLOG``), as ``ANCHOR_LOG_MARKER``
  followed by the same JSON, so a saved journal is an anchor file too.

A head is anchored only after the events since the last anchor were
recomputed (``verify_after``), so a chain broken in between is reported, never
sealed. ``check`` compares the table with anchors read back: an event whose
stored hash is not the anchored one was changed after that anchor was written;
an anchored event that is gone means the log was cut. Events newer than the
newest anchor are vouched for by the database alone (docs/security.md).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from logging.handlers import SysLogHandler
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.keys import central_public_key, central_signing_key
from gpuadmin.wire.signing import (
    BadMessage,
    MessageKind,
    canonical_json,
    open_envelope,
    public_key_text,
    seal,
)
from gpuadmin.wire.timestamps import wire_time

logger = logging.getLogger(__name__)

ANCHOR_VERSION = 1
# What precedes an anchor's JSON in a log line; verify_audit reads lines that carry it.
ANCHOR_LOG_MARKER = "gpuadmin-audit-anchor "
ANCHOR_FILE_MODE = 0o600
# The newest anchor is looked for in this much of the file's end (an anchor line is ~330 bytes).
TAIL_BYTES = 64 * 1024
# Stored hashes are read for this many anchored sequences per query (SQLite's variable limit).
LOOKUP_CHUNK = 500
_HEX = frozenset("0123456789abcdef")


class BadAnchor(ValueError):
    """A line that is not an anchor central signed; reported, never trusted."""


@dataclass(frozen=True)
class Anchor:
    sequence: int
    hash: str
    anchored_at: datetime
    where: str  # "FILE line N", for reports
    envelope: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # as signed

    def describe(self) -> str:
        return f"the anchor of event {self.sequence} written at {wire_time(self.anchored_at)} ({self.where})"


def anchor_body(sequence: int, hash_hex: str, anchored_at: datetime) -> dict[str, Any]:
    return {"anchor_version": ANCHOR_VERSION, "sequence": sequence, "hash": hash_hex,
            "anchored_at": wire_time(anchored_at)}


def parse_line(line: str, *, trusted: str, where: str) -> Anchor | None:
    """The anchor on one line; None: no anchor here.

    A line is an anchor file's (the envelope), a log line's (the marker, then the envelope), or an
    agent journal's: its claim line holds the order, whose ``audit_anchor`` is the envelope.

    BadAnchor when the line claims to be one but is malformed or not signed by ``trusted``.
    """
    text = line.strip()
    if ANCHOR_LOG_MARKER in text:
        text = text.split(ANCHOR_LOG_MARKER, 1)[1].strip()
    elif not text.startswith("{"):
        return None
    try:
        envelope = json.loads(text)
    except ValueError:
        raise BadAnchor(f"{where}: not JSON") from None
    if isinstance(envelope, dict) and isinstance(envelope.get("order"), dict):
        envelope = envelope["order"].get("audit_anchor")
        if envelope is None:
            return None
    elif isinstance(envelope, dict) and "kind" not in envelope:
        return None  # another line of an agent's journal: an event
    try:
        body = open_envelope(envelope, MessageKind.AUDIT_ANCHOR, trusted=trusted).body()
    except (BadMessage, ValueError) as error:
        raise BadAnchor(f"{where}: {error}") from None
    if not isinstance(body, dict) or body.get("anchor_version") != ANCHOR_VERSION:
        raise BadAnchor(f"{where}: signed, but not an anchor of version {ANCHOR_VERSION}")
    sequence, hash_hex, at = body.get("sequence"), body.get("hash"), body.get("anchored_at")
    if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
        raise BadAnchor(f"{where}: signed, but its sequence is not a positive integer")
    if not isinstance(hash_hex, str) or len(hash_hex) != 64 or not set(hash_hex) <= _HEX:
        raise BadAnchor(f"{where}: signed, but its hash is not 64 hex digits")
    try:
        anchored_at = datetime.fromisoformat(str(at))
    except ValueError:
        raise BadAnchor(f"{where}: signed, but its time is not ISO 8601") from None
    return Anchor(sequence=sequence, hash=hash_hex, anchored_at=anchored_at, where=where, envelope=envelope)


@dataclass
class AnchorsRead:
    anchors: list[Anchor] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # lines that claimed to be anchors and are not
    missing: list[str] = field(default_factory=list)  # files that are not there


def trusted_key() -> str:
    """Central's public key as anchors are checked with (the pinned one, else the signing key's)."""
    key = central_public_key()
    if key is None:
        raise BadAnchor("no central public key to check anchors with (GPUADMIN_CENTRAL_PUBLIC_KEY)")
    return key


def read(paths: Iterable[Path], *, trusted: str | None = None) -> AnchorsRead:
    """Every anchor in ``paths`` (anchor files, saved logs, or an agent's journal directory), with what
    was wrong with the rest."""
    trusted = trusted or trusted_key()
    found = AnchorsRead()
    files = [file for path in paths for file in (sorted(path.glob("*.jsonl")) if path.is_dir() else [path])]
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as file:
                for number, line in enumerate(file, start=1):
                    try:
                        anchor = parse_line(line, trusted=trusted, where=f"{path} line {number}")
                    except BadAnchor as error:
                        found.problems.append(str(error))
                        continue
                    if anchor is not None:
                        found.anchors.append(anchor)
        except FileNotFoundError:
            found.missing.append(str(path))
    return found


def newest(path: Path, *, trusted: str) -> Anchor | None:
    """The last good anchor in the file's tail (the file grows for good; it is not read whole)."""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - TAIL_BYTES))
            tail = file.read().decode("utf-8", errors="replace")
    except OSError:  # missing, or not readable by this process (a sink owned by another user)
        return None
    lines = tail.splitlines()
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first may be cut
    for line in reversed(lines):
        try:
            anchor = parse_line(line, trusted=trusted, where=f"{path} (tail)")
        except BadAnchor:
            continue
        if anchor is not None:
            return anchor
    return None


def newest_envelope() -> dict[str, Any] | None:
    """The newest anchor as central signed it, for a kill order to carry into the agent's journal.

    None when there is none to read: an order never waits for, or fails on, its anchor.
    """
    try:
        last = newest(Path(settings.GPUADMIN_AUDIT_ANCHOR_FILE), trusted=trusted_key())
    except BadAnchor:
        return None
    return last.envelope if last is not None else None


# --- publishing ---------------------------------------------------------------------


class ChainBroken(RuntimeError):
    """The chain does not verify from the last anchor on: nothing is anchored."""


def publish(using: str = "default", *, now: datetime | None = None) -> Anchor | None:
    """Verify the events since the last anchor, then sign and publish the head; None when nothing is new.

    Raises ChainBroken (and anchors nothing) when they do not verify.
    """
    path = Path(settings.GPUADMIN_AUDIT_ANCHOR_FILE)
    key = central_signing_key()
    last = newest(path, trusted=public_key_text(key))
    events = AuditEvent.objects.using(using)
    result = events.verify_after(last.sequence, last.hash) if last is not None else events.verify()
    if not result.ok:
        raise ChainBroken(f"not anchored: {result.summary()}")
    if result.head_sequence is None or result.head_hash is None:
        return None  # an empty log
    if last is not None and result.head_sequence == last.sequence:
        return None
    anchored_at = now or timezone.now()
    line = canonical_json(seal(anchor_body(result.head_sequence, result.head_hash, anchored_at),
                               MessageKind.AUDIT_ANCHOR, key))
    _append(path, line)
    _anchor_log().info("%s%s", ANCHOR_LOG_MARKER, line)
    return Anchor(sequence=result.head_sequence, hash=result.head_hash, anchored_at=anchored_at,
                  where=str(path))


def _append(path: Path, line: str) -> None:
    # One write of one line with O_APPEND: concurrent writers never interleave within a line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, ANCHOR_FILE_MODE)
    try:
        os.write(fd, (line + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _anchor_log() -> logging.Logger:
    address = settings.GPUADMIN_AUDIT_ANCHOR_SYSLOG
    if address and not any(isinstance(h, SysLogHandler) for h in logger.handlers):
        handler = SysLogHandler(address=address, facility=SysLogHandler.LOG_AUTH)
        handler.setFormatter(logging.Formatter("gpuadmin: %(message)s"))
        logger.addHandler(handler)
    return logger


# --- checking -----------------------------------------------------------------------


@dataclass(frozen=True)
class AnchorCheck:
    """The table against the anchors read: ``ok`` when every anchored event still has its anchored hash."""

    ok: bool
    anchors: int
    lines: tuple[str, ...]  # what to tell people, in order
    newest_sequence: int | None = None
    first_bad_sequence: int | None = None


def check(read_back: AnchorsRead, using: str = "default") -> AnchorCheck:
    """Compare each anchored event's stored hash with the anchored one; name the first that disagrees."""
    lines = [f"forged or malformed anchor, not trusted: {problem}" for problem in read_back.problems]
    anchors = sorted(read_back.anchors, key=lambda a: (a.sequence, a.anchored_at))
    if not anchors:
        where = ", ".join(read_back.missing) or "the anchor files"
        lines.append(f"no anchors in {where}: nothing outside the database vouches for this chain")
        return AnchorCheck(ok=not read_back.problems, anchors=0, lines=tuple(lines))
    stored = _stored_hashes(sorted({a.sequence for a in anchors}), using)
    head = AuditEvent.objects.using(using).order_by("-sequence").values_list("sequence", flat=True).first()
    last_good: Anchor | None = None
    for anchor in anchors:
        now_hash = stored.get(anchor.sequence)
        if now_hash == anchor.hash:
            last_good = anchor
            continue
        since = (f"events {last_good.sequence + 1} to {anchor.sequence}" if last_good is not None
                 else f"events 1 to {anchor.sequence}")
        if now_hash is None:
            lines.append(f"audit chain FAILED against anchors: event {anchor.sequence} is gone (the log now "
                         f"ends at {head or 0}), but {anchor.describe()} saw it: the log was cut")
        else:
            lines.append(f"audit chain FAILED against anchors: event {anchor.sequence} has hash "
                         f"{now_hash[:16]}…, not {anchor.hash[:16]}… as in {anchor.describe()}: one or more "
                         f"of {since} changed after that anchor")
        if last_good is not None:
            lines.append(f"events up to {last_good.sequence} are as {last_good.describe()} saw them")
        return AnchorCheck(ok=False, anchors=len(anchors), lines=tuple(lines),
                           newest_sequence=anchors[-1].sequence,
                           first_bad_sequence=last_good.sequence + 1 if last_good else 1)
    newest_anchor = max(anchors, key=lambda a: (a.sequence, a.anchored_at))
    lines.append(f"anchors OK: {len(anchors)} anchors agree; events up to {newest_anchor.sequence} are as "
                 f"{newest_anchor.describe()} saw them")
    if head is not None and head > newest_anchor.sequence:
        lines.append(f"events {newest_anchor.sequence + 1} to {head} are newer than every anchor: "
                     "the database alone vouches for them")
    return AnchorCheck(ok=not read_back.problems, anchors=len(anchors), lines=tuple(lines),
                       newest_sequence=newest_anchor.sequence)


def check_newest(using: str = "default") -> AnchorCheck:
    """The table against the newest anchor in the configured file only: cheap enough for every request."""
    path = Path(settings.GPUADMIN_AUDIT_ANCHOR_FILE)
    try:
        last = newest(path, trusted=trusted_key())
    except BadAnchor as error:
        return AnchorCheck(ok=False, anchors=0, lines=(str(error),))
    return check(AnchorsRead(anchors=[last] if last else [], missing=[] if last else [str(path)]), using)


def _stored_hashes(sequences: list[int], using: str) -> dict[int, str]:
    stored: dict[int, str] = {}
    for start in range(0, len(sequences), LOOKUP_CHUNK):
        chunk = sequences[start:start + LOOKUP_CHUNK]
        rows = AuditEvent.objects.using(using).filter(sequence__in=chunk).values_list("sequence", "hash")
        stored.update(rows)
    return stored
