"""Take the fleet page's screenshots for the README: `.venv/bin/python docs/screenshots/take.py`.

Runs tests/browser/test_fleet_attention.py (200 synthetic hosts, five offline, in Chromium at 1440 x 900
and 390 px wide) with GPUADMIN_FLEET_SCREENSHOTS pointing here, so the pictures are of exactly what that
test checks, then shrinks each PNG below MAX_BYTES: every channel rounded to LEVELS values, and the
picture written with a palette when it has at most 256 colours (the standard library only: no image
package is a dependency of the project).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NAMES = ("fleet-1440.png", "fleet-390.png")
MAX_BYTES = 300 * 1024
LEVELS = 12  # per channel: text stays crisp, anti-aliasing merges into a few greys
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunks(data: bytes) -> dict[bytes, bytes]:
    """The PNG's chunks by type (IDAT parts joined)."""
    chunks: dict[bytes, bytes] = {}
    at = len(PNG_SIGNATURE)
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        chunks[kind] = chunks.get(kind, b"") + data[at + 8:at + 8 + length]
        at += 12 + length
    return chunks


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    data = path.read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"{path} is not a PNG")
    chunks = _chunks(data)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"{path}: only 8-bit RGB or RGBA without interlacing is read here")
    channels = 3 if colour == 2 else 4
    stride = width * channels
    raw = zlib.decompress(chunks[b"IDAT"])
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = row[i - channels] if i >= channels else 0
            up = previous[i]
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                row[i] = (row[i] + _paeth(left, up, previous[i - channels] if i >= channels else 0)) & 0xFF
        previous = row
        rgb = bytes(row) if channels == 3 else bytes(b for i, b in enumerate(row) if i % 4 != 3)
        rows.append(rgb)
    return width, height, rows


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def write_small(path: Path, width: int, height: int, rows: list[bytes]) -> None:
    """The picture with each channel rounded to LEVELS values; a palette when 256 colours or fewer."""
    step = 255 / (LEVELS - 1)
    table = bytes(round(round(v / step) * step) for v in range(256))
    rows = [row.translate(table) for row in rows]
    colours: dict[bytes, int] = {}
    for row in rows:
        for i in range(0, len(row), 3):
            colours.setdefault(row[i:i + 3], len(colours))
            if len(colours) > 256:
                break
    if len(colours) <= 256:
        header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
        body = b"".join(b"\0" + bytes(colours[row[i:i + 3]] for i in range(0, len(row), 3)) for row in rows)
        extra = _chunk(b"PLTE", b"".join(colours))
    else:
        header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        body = b"".join(b"\0" + row for row in rows)
        extra = b""
    path.write_bytes(PNG_SIGNATURE + _chunk(b"IHDR", header) + extra
                     + _chunk(b"IDAT", zlib.compress(body, 9)) + _chunk(b"IEND", b""))


def main() -> int:
    test = ROOT / "tests" / "browser" / "test_fleet_attention.py"
    environ = {**os.environ, "GPUADMIN_FLEET_SCREENSHOTS": str(HERE)}
    run = subprocess.run([sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:randomly", "-n", "0"],
                         cwd=ROOT, env=environ, check=False)
    if run.returncode:
        return run.returncode
    for name in NAMES:
        path = HERE / name
        write_small(path, *read_rgb(path))
        size = path.stat().st_size
        print(f"{path.relative_to(ROOT)}: {size // 1024} KiB")
        if size > MAX_BYTES:
            print(f"{name} is over {MAX_BYTES // 1024} KiB", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
