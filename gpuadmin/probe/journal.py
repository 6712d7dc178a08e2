"""The agent's kill journal: one append-only file per request id, so that an
order delivered twice runs once.

Why files and not sqlite3: the two things the journal must guarantee map
directly onto two kernel primitives, with nothing in between to configure.

* **Claim exactly once.** The claim is written into a private temporary file,
  which is then hard-linked to ``<request_id>.jsonl``; ``link()`` fails with
  EEXIST when the name exists, atomically, across processes. Because the file is
  complete (claim line written and fsync'ed, lock taken) before its name
  appears, nobody can ever see a half-made claim.
* **Tell "still running" from "crashed".** The executor holds an exclusive
  ``flock`` on its file for as long as it runs. The kernel drops that lock when
  the process dies, however it dies. A second delivery waits for the lock:
  it then finds either a finished record (answer with it) or an unfinished one
  whose owner is gone (the order was interrupted).

Every line is one JSON object, written with a single ``write`` on an O_APPEND
descriptor and fsync'ed before the caller goes on, so the file is a
write-ahead log of what the executor did. Files are 0600 in a 0700 directory:
they hold user names and command-line digests of other people's processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuadmin.wire.files import staged_file, sync_directory, write_all
from gpuadmin.wire.kill_protocol import REQUEST_ID_PATTERN, Event

SUFFIX = ".jsonl"
CLAIM_PREFIX = ".claim-"
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


@dataclass(slots=True)
class JournalEntry:
    """What the journal holds for one request id."""

    request_id: str
    claim: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> dict[str, Any] | None:
        for event in reversed(self.events):
            if event.get("event") == Event.FINISHED:
                return event
        return None

    @property
    def last_seq(self) -> int:
        return max((int(event.get("seq", 0)) for event in self.events), default=0)


class JournalWriter:
    """An open, exclusively locked journal file: appends are durable when they return."""

    def __init__(self, fd: int, path: Path, entry: JournalEntry) -> None:
        self._fd = fd
        self.path = path
        self.entry = entry

    def append(self, record: dict[str, Any]) -> None:
        if self._fd < 0:
            raise ValueError(f"journal file {self.path} is closed")
        # default=str: an order handed over with datetimes still gets journaled, as text.
        line = (json.dumps(record, separators=(",", ":"), sort_keys=True, default=str) + "\n").encode()
        write_all(self._fd, line)
        os.fsync(self._fd)
        if record.get("record") != "claim":
            self.entry.events.append(record)

    def close(self) -> None:
        """Release the lock; an entry closed without a "finished" event reads as interrupted."""
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = -1

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Journal:
    """The journal directory (e.g. ``$GPUADMIN_DATA_DIR/agent-journal``)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        os.chmod(self.directory, DIRECTORY_MODE)

    def path_for(self, request_id: str) -> Path:
        if not REQUEST_ID_PATTERN.match(request_id):
            raise ValueError(f"request id {request_id!r} cannot name a journal file")
        return self.directory / f"{request_id}{SUFFIX}"

    def claim(self, request_id: str, claim_record: dict[str, Any]) -> JournalWriter | None:
        """Claim the request id, or None when it was claimed before (by anyone, ever)."""
        final_path = self.path_for(request_id)
        record = {"record": "claim", **claim_record}
        prefix = f"{CLAIM_PREFIX}{request_id}-{os.getpid()}-"
        with staged_file(final_path, mode=FILE_MODE, prefix=prefix) as staged:
            entry = JournalEntry(request_id=request_id, claim=record)
            writer = JournalWriter(staged.detach(), final_path, entry)
            try:
                fd = staged.fd
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
                fcntl.flock(fd, fcntl.LOCK_EX)
                writer.append(record)
                claimed = staged.link_into_place()
            except BaseException:
                writer.close()
                raise
        # The temporary name is gone: make the removal and the link durable.
        try:
            sync_directory(self.directory)
        except BaseException:
            writer.close()
            raise
        if not claimed:
            writer.close()
            return None
        return writer

    def wait_for(self, request_id: str) -> JournalWriter | None:
        """Open an existing entry once no executor holds it (blocks while one runs).

        Returns None when there is no entry. The caller gets the lock and may
        append (e.g. the "interrupted" answer) before closing.
        """
        path = self.path_for(request_id)
        for _attempt in range(5):
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_nlink == 0:
                    os.close(fd)  # pruned while we waited; look again
                    continue
                entry = _parse(request_id, _read_all(fd))
            except BaseException:
                os.close(fd)
                raise
            return JournalWriter(fd, path, entry)
        return None

    def read(self, request_id: str) -> JournalEntry | None:
        """The entry as it stands now, without waiting for a running executor."""
        try:
            data = self.path_for(request_id).read_bytes()
        except FileNotFoundError:
            return None
        return _parse(request_id, data)

    def prune(self, older_than_seconds: float, *, now: float | None = None) -> int:
        """Delete entries untouched for longer than ``older_than_seconds``; returns how many.

        An entry an executor still holds is kept whatever its age. Prune only
        well past the longest order deadline: a pruned request id could be
        claimed again, and only the deadline then stops a very late redelivery.
        """
        if older_than_seconds < 0:
            raise ValueError("older_than_seconds must not be negative")
        cutoff = (time.time() if now is None else now) - older_than_seconds
        removed = 0
        for path in self.directory.iterdir():
            if not (path.name.endswith(SUFFIX) or path.name.startswith(CLAIM_PREFIX)):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # an executor is working on it
                if os.fstat(fd).st_mtime < cutoff:
                    try:
                        path.unlink()
                        removed += 1
                    except FileNotFoundError:
                        pass
            finally:
                os.close(fd)
        if removed:
            sync_directory(self.directory)
        return removed


def _parse(request_id: str, data: bytes) -> JournalEntry:
    records: list[dict[str, Any]] = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash mid-write: it was never acknowledged
        if isinstance(record, dict):
            records.append(record)
    claim = records[0] if records and records[0].get("record") == "claim" else {}
    events = [record for record in records if record.get("record") != "claim"]
    return JournalEntry(request_id=request_id, claim=claim, events=events)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)

