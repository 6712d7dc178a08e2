"""A file appears whole or not at all: the one way gpuadmin writes a file others read.

Written under a temporary name beside its final one (one file system, so the
last step is atomic), then either linked into place, which fails when the name
exists (a key, a journal claim: the first writer wins and nothing is
overwritten), or renamed over the old one (a state file others poll). A reader
never sees half a file, and a crash leaves at most a hidden temporary behind.

Standard library only: the probe, the agent and central all use it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Only the owner: keys, the journal, the data directory's state.
PRIVATE_FILE_MODE = 0o600


class StagedFile:
    """A file being written under a temporary name; ``fd`` is open for reading and writing."""

    def __init__(self, fd: int, temporary: Path, path: Path) -> None:
        self.fd = fd
        self.temporary = temporary
        self.path = path
        self.detached = False

    def link_into_place(self) -> bool:
        """Give the file its final name unless that name exists; False then (the file there stands)."""
        try:
            os.link(self.temporary, self.path)
        except FileExistsError:
            return False
        return True

    def replace_into_place(self) -> None:
        """Give the file its final name, replacing what had it."""
        os.replace(self.temporary, self.path)

    def detach(self) -> int:
        """Keep the descriptor open past the ``with`` block: the caller closes it (the journal's lock)."""
        self.detached = True
        return self.fd


@contextmanager
def staged_file(
    path: Path, *, mode: int = PRIVATE_FILE_MODE, prefix: str | None = None
) -> Iterator[StagedFile]:
    """A new, empty file beside ``path`` under a temporary name, with ``mode`` whatever the umask.

    The caller writes to ``fd`` and publishes it with ``link_into_place`` or
    ``replace_into_place``. On the way out the temporary name is removed (a
    linked file keeps its final name) and the descriptor closed unless
    detached. ``prefix`` names the temporary, ``.<name>-`` unless given.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=prefix if prefix is not None else f".{path.name}-")
    staged = StagedFile(fd=fd, temporary=Path(name), path=path)
    try:
        os.fchmod(fd, mode)
        yield staged
    finally:
        if not staged.detached:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):  # renamed into place
            os.unlink(staged.temporary)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (os.write may write fewer than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_file(
    path: Path, data: bytes | str, *, mode: int = PRIVATE_FILE_MODE, replace: bool = True, sync: bool = True
) -> bool:
    """Write ``data`` to ``path`` whole: nobody ever reads half of it.

    ``replace``: rename over whatever is there (True is returned). Otherwise
    link, so an existing file stands and False is returned: several processes
    may start at once and the first one wins. ``sync`` makes the data durable
    before the name appears (keys; not a state file rewritten every few seconds).
    """
    with staged_file(path, mode=mode) as staged:
        write_all(staged.fd, data.encode() if isinstance(data, str) else data)
        if sync:
            os.fsync(staged.fd)
        if replace:
            staged.replace_into_place()
            return True
        return staged.link_into_place()


def sync_directory(directory: Path) -> None:
    """Make a created, linked or removed name itself durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
