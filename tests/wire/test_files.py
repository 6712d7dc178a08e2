"""gpuadmin/wire/files.py: the one atomic file write (keys, the journal, supervisor state, demo GPUs)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from gpuadmin.wire.files import staged_file, write_file


def names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_a_linked_file_never_overwrites_the_first_one(tmp_path: Path) -> None:
    path = tmp_path / "key"
    assert write_file(path, "first", replace=False) is True
    assert write_file(path, "second", replace=False) is False
    assert path.read_text() == "first"
    assert names(tmp_path) == ["key"]  # no temporary left behind


def test_a_replaced_file_is_the_new_text_with_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    old_umask = os.umask(0)
    try:
        assert write_file(path, b"new", mode=0o640, sync=False) is True
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert names(tmp_path) == ["state.json"]


def test_a_reader_sees_the_old_text_or_the_new_never_a_part(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    texts = ["a" * 200_000, "b" * 300_000]
    write_file(path, texts[0], sync=False)
    seen: set[str] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for number in range(200):
            write_file(path, texts[number % 2], sync=False)
    finally:
        stop.set()
        reader.join()
    assert seen <= set(texts)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), staged_file(path) as staged:
        os.write(staged.fd, b"half")
        raise RuntimeError("crashed mid-write")
    assert path.read_text() == "old"
    assert names(tmp_path) == ["state.json"]


def test_a_detached_descriptor_outlives_the_block_and_the_temporary_name(tmp_path: Path) -> None:
    path = tmp_path / "claim.jsonl"
    with staged_file(path, prefix=".claim-x-") as staged:
        assert staged.temporary.name.startswith(".claim-x-")
        fd = staged.detach()
        os.write(fd, b"claim\n")
        assert staged.link_into_place() is True
    try:
        os.write(fd, b"event\n")  # still open: the journal keeps its lock through it
    finally:
        os.close(fd)
    assert path.read_bytes() == b"claim\nevent\n"
    assert names(tmp_path) == ["claim.jsonl"]
