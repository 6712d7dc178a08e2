"""gpuadmin/wire/signing.py: one canonical encoding, signatures that fail on any change."""

from __future__ import annotations

import base64
import json
import os
import stat
import zlib
from pathlib import Path

import pytest

from gpuadmin.audit.chain import canonical_json as audit_canonical_json
from gpuadmin.wire.signing import (
    BadMessage,
    MessageKind,
    canonical_json,
    compress_envelope,
    create_private_key_file,
    fingerprint,
    generate_private_key,
    load_private_key,
    open_envelope,
    parse_public_key,
    public_key_text,
    seal,
)

BODY = {"b": [1, 2.5, "\u202e"], "a": {"z": None, "y": True}}


def test_the_audit_chain_and_the_signatures_share_one_encoding() -> None:
    assert audit_canonical_json is canonical_json
    assert canonical_json(BODY) == '{"a":{"y":true,"z":null},"b":[1,2.5,"\\u202e"]}'


def test_a_sealed_message_opens_with_its_text_and_signer() -> None:
    key = generate_private_key()
    opened = open_envelope(seal(BODY, MessageKind.SNAPSHOT, key), MessageKind.SNAPSHOT)
    assert opened.body() == BODY
    assert opened.public_key == public_key_text(key) and opened.fingerprint == fingerprint(key)
    assert opened.fingerprint.startswith("SHA256:") and "=" not in opened.fingerprint


def test_a_message_survives_the_brokers_json_round_trip() -> None:
    key = generate_private_key()
    message = json.loads(json.dumps(seal(BODY, MessageKind.ORDER, key)))
    assert open_envelope(message, MessageKind.ORDER, trusted=public_key_text(key)).body() == BODY


@pytest.mark.parametrize("position", [0, 10, -2])
def test_any_changed_byte_of_the_text_fails(position: int) -> None:
    message = seal(BODY, MessageKind.KILL_REPORT, generate_private_key())
    text = message["text"]
    changed = chr(ord(text[position]) ^ 1)
    message["text"] = text[:position] + changed + text[position + 1:] if position != -2 else text[:-2] + "0}"
    with pytest.raises(BadMessage, match="does not verify"):
        open_envelope(message, MessageKind.KILL_REPORT)


def test_a_message_of_one_kind_never_passes_as_another() -> None:
    message = seal(BODY, MessageKind.SNAPSHOT, generate_private_key())
    with pytest.raises(BadMessage, match="where a 'order' was expected"):
        open_envelope(message, MessageKind.ORDER)
    message["kind"] = "order"  # relabelled: the signature covered the kind
    with pytest.raises(BadMessage, match="does not verify"):
        open_envelope(message, MessageKind.ORDER)


def test_another_key_is_refused_when_one_is_trusted() -> None:
    message = seal(BODY, MessageKind.ORDER, generate_private_key())
    with pytest.raises(BadMessage, match="not by the trusted key"):
        open_envelope(message, MessageKind.ORDER, trusted=public_key_text(generate_private_key()))


def test_a_key_swapped_in_with_the_old_signature_fails() -> None:
    message = seal(BODY, MessageKind.ORDER, generate_private_key())
    message["key"] = public_key_text(generate_private_key())
    with pytest.raises(BadMessage, match="does not verify"):
        open_envelope(message, MessageKind.ORDER)


@pytest.mark.parametrize("message", [None, "text", {"v": 1}, {"v": 2, "kind": "order"},
                                     {"v": 1, "kind": "order", "text": "{}", "key": "rsa:x", "sig": "AA=="}])
def test_anything_but_an_envelope_is_a_bad_message(message: object) -> None:
    with pytest.raises(BadMessage):
        open_envelope(message, MessageKind.ORDER)


def test_a_text_over_the_limit_is_refused_before_verifying() -> None:
    message = seal({"x": "y" * 100}, MessageKind.SNAPSHOT, generate_private_key())
    with pytest.raises(BadMessage, match="over the limit"):
        open_envelope(message, MessageKind.SNAPSHOT, max_text_chars=50)


def test_a_compressed_message_opens_with_the_same_text_and_signer_after_the_brokers_round_trip() -> None:
    key = generate_private_key()
    sealed = seal({"rows": [BODY] * 200}, MessageKind.SNAPSHOT, key)
    compressed = json.loads(json.dumps(compress_envelope(sealed)))
    assert "text" not in compressed and len(compressed["zlib"]) * 10 < len(sealed["text"])
    opened = open_envelope(compressed, MessageKind.SNAPSHOT)
    assert (opened.text, opened.public_key) == (sealed["text"], public_key_text(key))
    assert "zlib" not in sealed  # sealing alone compresses nothing: only senders that choose to


def packed(text: str | bytes) -> str:
    return base64.b64encode(zlib.compress(text.encode() if isinstance(text, str) else text)).decode()


def test_a_changed_compressed_text_fails_its_signature() -> None:
    sealed = seal(BODY, MessageKind.SNAPSHOT, generate_private_key())
    compressed = compress_envelope(sealed)
    compressed["zlib"] = packed(sealed["text"].replace("true", "null"))
    with pytest.raises(BadMessage, match="does not verify"):
        open_envelope(compressed, MessageKind.SNAPSHOT)


def test_a_compressed_text_inflates_no_further_than_the_limit() -> None:
    sealed = seal(BODY, MessageKind.SNAPSHOT, generate_private_key())
    bomb = {**compress_envelope(sealed), "zlib": packed("1" * 10_000_000)}  # 10 MB in ~14 kB of base64
    assert len(bomb["zlib"]) < 20_000
    with pytest.raises(BadMessage, match="inflates past the limit of 50000 characters"):
        open_envelope(bomb, MessageKind.SNAPSHOT, max_text_chars=50_000)
    # Nor is a compressed text longer than the limit itself decoded at all.
    with pytest.raises(BadMessage, match=r"compressed text has \d+ characters, over the limit of 5000"):
        open_envelope(bomb, MessageKind.SNAPSHOT, max_text_chars=5000)


@pytest.mark.parametrize(("change", "error"), [
    ({"zlib": "not base64!"}, "compressed text is not base64"),
    ({"zlib": base64.b64encode(b"not zlib at all").decode()}, "does not inflate"),
    ({"zlib": packed("{}")[:-8]}, "does not inflate|cut short"),
    ({"zlib": base64.b64encode(zlib.compress(b"{}") + b"more").decode()}, "bytes after its end"),
    ({"zlib": packed("{\"a\":\"\u00e9\"}".encode("utf-8"))}, "not ASCII"),
    ({"zlib": 12}, "must be a base64 string"),
    ({"text": "{}"}, "one 'text' string, or its compressed 'zlib'"),
])
def test_a_compressed_message_that_is_not_one_text_is_a_bad_message(change: dict[str, object],
                                                                   error: str) -> None:
    message = {**compress_envelope(seal(BODY, MessageKind.SNAPSHOT, generate_private_key())), **change}
    with pytest.raises(BadMessage, match=error):
        open_envelope(message, MessageKind.SNAPSHOT)


def test_a_message_without_text_says_it_needs_one() -> None:
    message = seal(BODY, MessageKind.SNAPSHOT, generate_private_key())
    del message["text"]
    with pytest.raises(BadMessage, match="one 'text' string, or its compressed 'zlib'"):
        open_envelope(message, MessageKind.SNAPSHOT)


def test_a_key_file_is_created_once_0600_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "key"
    old_umask = os.umask(0)
    try:
        assert create_private_key_file(path) is True
    finally:
        os.umask(old_umask)
    first = path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert create_private_key_file(path) is False and path.read_bytes() == first
    key = load_private_key(path)
    assert parse_public_key(public_key_text(key)) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]  # no temporary file left
