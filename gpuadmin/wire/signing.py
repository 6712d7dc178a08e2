"""Ed25519 signatures on what crosses the broker: orders, snapshots, kill reports.

The broker is not a trusted party (docs/security.md): every GPU host holds its
URL, so anyone root on one host can read and write every queue. What makes a
message count is a signature, never the queue it came through:

- central signs each kill order with its key; agents pin central's public key;
- each agent signs its snapshots and kill reports with its own key, which an
  approver accepted once (``fleet`` stores it per host).

One encoding is signed everywhere: ``canonical_json`` (sorted keys, no
whitespace, ASCII only, no NaN), the same text the audit chain hashes. A
message travels as an envelope whose ``text`` is that encoding of the body::

    {"v": 1, "kind": "order", "text": "{...}", "key": "ed25519:<base64>", "sig": "<base64>"}

or, compressed (``compress_envelope``: what full snapshots travel as, ~12 times smaller), with
``"zlib": "<base64 of the text, zlib-compressed>"`` in place of ``text``. The signature is the
text's either way; a receiver inflates at most its size limit (``open_envelope``'s
``max_text_chars``, else ``INFLATE_MAX_CHARS``) and then verifies the text as above.

The signature covers the kind and the text (``kind`` + LF + text), so a signed
snapshot can never pass as an order or a report. The receiver verifies the
bytes it got *before* parsing them, and parses exactly what was signed: no
re-encoding, so nothing depends on how a JSON library orders keys or writes
floats on the way.

Plain library: no Django, no Celery (the agent uses it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpuadmin.wire.files import write_file

ENVELOPE_VERSION = 1
PUBLIC_KEY_PREFIX = "ed25519:"
FINGERPRINT_PREFIX = "SHA256:"
KEY_FILE_MODE = 0o600
_RAW_KEY_BYTES = 32
_SIGNATURE_BYTES = 64
# What a compressed envelope may inflate to when its receiver names no smaller limit: nothing unsigned
# makes a receiver hold more than this (a few bytes of zlib can claim gigabytes).
INFLATE_MAX_CHARS = 64 * 1024 * 1024
# zlib's fastest level: a 114 KB snapshot text in 9 KB for 0.3 ms (level 6: 7 KB for 0.9 ms).
_ZLIB_LEVEL = 1
_NEEDS_STRINGS = "a signed message needs 'text', 'key' and 'sig' strings"
_NOT_ASCII = "the signed text is not ASCII, so not the canonical encoding that is signed"


class MessageKind(StrEnum):
    """What a signed message is; part of what is signed."""

    ORDER = "order"  # central -> agent: a kill order
    SNAPSHOT = "snapshot"  # agent -> central
    SNAPSHOT_UPDATE = "snapshot_update"  # agent -> central: what moved since a snapshot
    KILL_REPORT = "kill_report"  # agent -> central: one event of an order it executes (or refused)
    AUDIT_ANCHOR = "audit_anchor"  # central -> outside the database: the audit chain's head


class BadMessage(ValueError):
    """A message that is not a valid signed envelope, or whose signature does not verify."""


def canonical_json(value: Any) -> str:
    """The one text a JSON value is signed and hashed as: sorted keys, no whitespace, ASCII, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


# --- keys -------------------------------------------------------------------------


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM (PKCS#8) file; ValueError says what is wrong."""
    data = Path(path).read_bytes()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path} is not an unencrypted PEM private key: {error}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def create_private_key_file(path: Path) -> bool:
    """Write a new key (0600) whole, unless one exists: False then.

    Several processes may start at once: the first one's key wins, and nobody
    ever reads half a key.
    """
    if path.exists():
        return False
    return write_file(path, private_key_pem(generate_private_key()), mode=KEY_FILE_MODE, replace=False)


def public_key_text(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """'ed25519:<base64 of the 32 raw bytes>': one line, what an agent pins and central stores."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def parse_public_key(text: str) -> Ed25519PublicKey:
    """The key in ``public_key_text`` form; ValueError when it is not one."""
    if not isinstance(text, str) or not text.strip().startswith(PUBLIC_KEY_PREFIX):
        raise ValueError(f"a public key looks like '{PUBLIC_KEY_PREFIX}<base64>'; got {str(text)[:80]!r}")
    raw = _b64decode(text.strip()[len(PUBLIC_KEY_PREFIX):], "public key")
    if len(raw) != _RAW_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key has {_RAW_KEY_BYTES} bytes; this one has {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def fingerprint(key: str | Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """'SHA256:<base64, unpadded>' of the raw public key, as ssh-keygen -l writes them."""
    public = parse_public_key(key) if isinstance(key, str) else key
    if isinstance(public, Ed25519PrivateKey):
        public = public.public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    digest = base64.b64encode(hashlib.sha256(raw).digest()).decode("ascii").rstrip("=")
    return FINGERPRINT_PREFIX + digest


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"the {what} is not base64") from None


# --- envelopes --------------------------------------------------------------------


def _signed_bytes(kind: MessageKind, text: str) -> bytes:
    return kind.value.encode("ascii") + b"\n" + text.encode("ascii")


def seal(body: Any, kind: MessageKind, key: Ed25519PrivateKey) -> dict[str, Any]:
    """The signed envelope of ``body`` (any JSON value), ready to send."""
    return seal_text(canonical_json(body), kind, key)


def seal_text(text: str, kind: MessageKind, key: Ed25519PrivateKey) -> dict[str, Any]:
    """The signed envelope of ``text`` as it is (ASCII): what ``seal`` sends for a body's canonical text.
    Senders seal bodies; the tests seal texts a receiver must refuse after checking the signature."""
    return {
        "v": ENVELOPE_VERSION,
        "kind": kind.value,
        "text": text,
        "key": public_key_text(key),
        "sig": base64.b64encode(key.sign(_signed_bytes(kind, text))).decode("ascii"),
    }


def compress_envelope(message: dict[str, Any]) -> dict[str, Any]:
    """The same signed envelope with its text compressed (``"zlib"`` in place of ``"text"``): the
    signature, over the text, still verifies once the receiver inflates it."""
    packed = zlib.compress(message["text"].encode("ascii"), _ZLIB_LEVEL)
    compressed = {name: value for name, value in message.items() if name != "text"}
    compressed["zlib"] = base64.b64encode(packed).decode("ascii")
    return compressed


def envelope_text(message: dict[str, Any], *, max_text_chars: int | None = None) -> str:
    """The text an envelope carries, inflated when it came compressed; BadMessage when there is none,
    or when it is longer than ``max_text_chars`` (inflating stops there)."""
    text, packed = message.get("text"), message.get("zlib")
    if (text is None) == (packed is None):
        raise BadMessage("a signed message needs one 'text' string, or its compressed 'zlib' instead")
    if text is None:
        text = _inflated(packed, INFLATE_MAX_CHARS if max_text_chars is None else max_text_chars)
    if not isinstance(text, str):
        raise BadMessage(_NEEDS_STRINGS)
    if max_text_chars is not None and len(text) > max_text_chars:
        raise BadMessage(f"the signed text has {len(text)} characters, over the limit of {max_text_chars}")
    return text


def _inflated(packed: Any, max_chars: int) -> str:
    if not isinstance(packed, str):
        raise BadMessage("a compressed message's 'zlib' must be a base64 string")
    if len(packed) > max_chars:  # never longer than its text, but for text no zlib can shorten
        raise BadMessage(f"the compressed text has {len(packed)} characters, over the limit of {max_chars}")
    try:
        data = _b64decode(packed, "compressed text")
    except ValueError as error:
        raise BadMessage(str(error)) from None
    inflater = zlib.decompressobj()
    try:
        inflated = inflater.decompress(data, max_chars + 1)
    except zlib.error as error:
        raise BadMessage(f"the compressed text does not inflate: {error}") from None
    if len(inflated) > max_chars:
        raise BadMessage(f"the compressed text inflates past the limit of {max_chars} characters")
    if not inflater.eof or inflater.unused_data:
        raise BadMessage("the compressed text is cut short or has bytes after its end")
    try:
        return inflated.decode("ascii")
    except UnicodeDecodeError:
        raise BadMessage(_NOT_ASCII) from None


@dataclass(frozen=True, slots=True)
class Opened:
    """A message whose signature verified: who signed it, and the exact text they signed."""

    kind: MessageKind
    text: str
    public_key: str  # 'ed25519:...'
    fingerprint: str

    def body(self) -> Any:
        """The signed text, parsed (ValueError when it is not JSON)."""
        return json.loads(self.text)


def open_envelope(
    message: Any,
    kind: MessageKind,
    *,
    trusted: str | None = None,
    max_text_chars: int | None = None,
) -> Opened:
    """Check an envelope's shape and signature; BadMessage says what is wrong.

    ``trusted`` (a public key text) is the only key accepted when given (an
    agent pins central's key this way); without it the envelope's own key is
    verified and returned, for the caller to compare with the one it accepted.
    The text is size-checked before anything is verified or parsed (a compressed one is inflated up
    to the limit, ``envelope_text``).
    """
    if not isinstance(message, dict):
        raise BadMessage(f"not a signed message (a {type(message).__name__}, not an envelope)")
    if message.get("v") != ENVELOPE_VERSION:
        raise BadMessage(f"not a signed message of version {ENVELOPE_VERSION} (v={message.get('v')!r:.40})")
    if message.get("kind") != kind.value:
        raise BadMessage(f"a signed {str(message.get('kind'))[:40]!r} where a {kind.value!r} was expected")
    key_text, signature_text = message.get("key"), message.get("sig")
    if not isinstance(key_text, str) or not isinstance(signature_text, str):
        raise BadMessage(_NEEDS_STRINGS)
    text = envelope_text(message, max_text_chars=max_text_chars)
    if not text.isascii():
        raise BadMessage(_NOT_ASCII)
    try:
        public_key = parse_public_key(key_text)
        signature = _b64decode(signature_text, "signature")
    except ValueError as error:
        raise BadMessage(str(error)) from None
    if len(signature) != _SIGNATURE_BYTES:
        raise BadMessage(f"an Ed25519 signature has {_SIGNATURE_BYTES} bytes; this one has {len(signature)}")
    if trusted is not None and fingerprint(public_key) != fingerprint(trusted):
        raise BadMessage(
            f"signed by {fingerprint(public_key)}, not by the trusted key {fingerprint(trusted)}"
        )
    try:
        public_key.verify(signature, _signed_bytes(kind, text))
    except InvalidSignature:
        raise BadMessage(f"the signature does not verify with key {fingerprint(public_key)}") from None
    return Opened(kind=kind, text=text, public_key=public_key_text(public_key),
                  fingerprint=fingerprint(public_key))
