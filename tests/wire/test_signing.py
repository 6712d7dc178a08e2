"""gpuadmin/wire/signing.py: one canonical encoding, signatures that fail on any change."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuadmin.audit.chain import canonical_json as audit_canonical_json
from gpuadmin.wire.signing import (
    BadMessage,
    MessageKind,
    canonical_json,
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
