"""The one place tests sign: a key per host name, messages signed as an agent or central signs them.

A host's test key is made once per test process and kept; ``accept`` enrols
the host with it (as an approver would), ``install_agent_key`` puts it where
an agent in a given data directory reads its own key, so that what a real
agent signs verifies as that host's.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuadmin.data_dir import AGENT_SIGNING_KEY
from gpuadmin.wire.signing import (
    MessageKind,
    compress_envelope,
    fingerprint,
    generate_private_key,
    private_key_pem,
    public_key_text,
    seal,
    seal_text,
)

_HOST_KEYS: dict[str, Ed25519PrivateKey] = {}


def host_key(host_name: str) -> Ed25519PrivateKey:
    if host_name not in _HOST_KEYS:
        _HOST_KEYS[host_name] = generate_private_key()
    return _HOST_KEYS[host_name]


def accept(host_name: str) -> Any:
    """Enrol the host with its test key (needs the database); returns the Host."""
    from gpuadmin.fleet.intake import trust

    return trust.accept_host(host_name, actor_name="tests", public_key=public_key_text(host_key(host_name)))


def enrol(host: Any) -> Any:
    """Give a Host row its test key, accepted, directly (a fixture shortcut: no audit event)."""
    from django.utils import timezone

    from gpuadmin.wire.signing import fingerprint

    host.public_key = public_key_text(host_key(host.name))
    host.key_fingerprint = fingerprint(host.public_key)
    host.key_accepted_at = host.key_offered_at = timezone.now()
    host.key_accepted_by_name = "tests"
    host.save()
    return host


def install_agent_key(data_dir: Path, host_name: str) -> None:
    """Make ``data_dir``'s agent sign as ``host_name``'s test key (0600, as the agent writes its own)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / AGENT_SIGNING_KEY
    path.write_bytes(private_key_pem(host_key(host_name)))
    path.chmod(0o600)


def signed_snapshot(document: dict[str, Any], *, key: Ed25519PrivateKey | None = None) -> dict[str, Any]:
    """The message an agent sends for ``document`` (signed by its host's test key unless ``key``)."""
    return seal(document, MessageKind.SNAPSHOT, key or host_key(document["host"]["name"]))


def deliver(snapshot: dict[str, Any] | str, *, received_at: datetime | None = None,
            accept_key: bool = True) -> Any:
    """Store a snapshot the way central stores every one (``ingest.receive_snapshot``); returns the Host.

    ``snapshot``: a document (sealed and compressed as an agent sends it) or a JSON text, sealed as it
    is (to send one that is spoiled, or spelled another way), signed by its host's test key. A host
    whose key is not accepted yet goes the way a new agent's does: its snapshot offers the key (the host
    first seen then), an approver accepts that fingerprint (``trust.accept_host``, audited), and the
    snapshot is sent again; ``accept_key=False`` leaves it awaiting. Raises ``SnapshotRejected`` as
    receive_snapshot does; an AssertionError when the host is left awaiting acceptance."""
    from gpuadmin.fleet.intake import trust
    from gpuadmin.fleet.intake.ingest import receive_snapshot
    from gpuadmin.fleet.intake.validation import host_name_from_text

    if isinstance(snapshot, str):
        try:
            host_name = json.loads(snapshot)["host"]["name"]
        except (ValueError, KeyError, TypeError):  # spoiled: the name as a rejection reads it
            host_name = host_name_from_text(snapshot)
        message = seal_text(snapshot, MessageKind.SNAPSHOT, host_key(host_name))
    else:
        host_name = snapshot["host"]["name"]
        message = compress_envelope(signed_snapshot(snapshot))  # as gpuadmin.sending sends it
    host = receive_snapshot(message, received_at=received_at)
    if host is None and accept_key:  # offered: accepted as an approver accepts it, then sent again
        trust.accept_host(host_name, actor_name="tests",
                          expected_fingerprint=fingerprint(host_key(host_name)),
                          ask_for_snapshot=False)
        host = receive_snapshot(message, received_at=received_at)
    assert host is not None, f"{host_name} awaits acceptance"
    return host


def signed_report(event: dict[str, Any], host_name: str, *,
                  key: Ed25519PrivateKey | None = None) -> dict[str, Any]:
    """A kill report as the agent of ``host_name`` sends it."""
    return seal({**event, "host": host_name}, MessageKind.KILL_REPORT, key or host_key(host_name))


def central_signed(order: dict[str, Any]) -> dict[str, Any]:
    """An order signed with this test run's central key (as dispatch signs)."""
    from gpuadmin.keys import central_signing_key

    return seal(order, MessageKind.ORDER, central_signing_key())
