"""The Ed25519 keys on each side, found once (docs/security.md).

- Central's signing key: ``settings.GPUADMIN_SIGNING_KEY_PATH`` (the data dir
  step makes it, 0600, unless GPUADMIN_SIGNING_KEY_FILE names one). It signs
  every kill order; ``manage.py central_key`` prints its public half.
- An agent's own key: ``agent_signing_key`` in the agent's data directory, made
  on the agent's first start. It signs the agent's snapshots and kill reports;
  an approver accepts its public half once per host.
- Central's public key as an agent pins it: GPUADMIN_CENTRAL_PUBLIC_KEY (or
  _FILE). On one box (``make run``) the agent and central share a data
  directory, and the agent reads the public half of the key next to it.

The signing itself is ``gpuadmin.wire.signing`` (no Django). Keys are read
when first used and kept while their file is unchanged. Django's settings are
imported inside the functions that need them: ``gpuadmin.run`` and
``python -m gpuadmin.agent`` call the path-based ones before settings load.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuadmin.data_dir import AGENT_SIGNING_KEY
from gpuadmin.wire.signing import create_private_key_file, fingerprint, load_private_key, public_key_text

logger = logging.getLogger(__name__)


class KeyMissing(RuntimeError):
    """A key this side needs is not there; the message says how to make it."""


@lru_cache(maxsize=8)
def _load(path: str, _mtime_ns: int) -> Ed25519PrivateKey:
    return load_private_key(path)


def read_private_key(path: Path) -> Ed25519PrivateKey:
    """The key in ``path``, read again only when the file changed."""
    try:
        mtime_ns = path.stat().st_mtime_ns
    except FileNotFoundError:
        raise KeyMissing(f"no signing key at {path}") from None
    return _load(str(path), mtime_ns)


def ensure_agent_key(data_dir: Path) -> tuple[Ed25519PrivateKey, bool]:
    """This agent's key in ``data_dir``, made (0600) when missing; and whether it was made now."""
    path = data_dir / AGENT_SIGNING_KEY
    created = create_private_key_file(path)
    key = read_private_key(path)
    if created:
        logger.warning("created this agent's signing key %s; its fingerprint is %s (an approver accepts "
                       "the host when the panel shows this fingerprint)", path, fingerprint(key))
    return key, created


# --- through the settings ----------------------------------------------------------


def central_signing_key() -> Ed25519PrivateKey:
    from django.conf import settings

    path = Path(settings.GPUADMIN_SIGNING_KEY_PATH)
    try:
        return read_private_key(path)
    except KeyMissing:
        raise KeyMissing(
            f"central's signing key {path} is missing; create it with `python -m gpuadmin.data_dir`, "
            "or point GPUADMIN_SIGNING_KEY_FILE at it"
        ) from None


def agent_signing_key() -> Ed25519PrivateKey:
    from django.conf import settings

    return ensure_agent_key(Path(settings.DATA_DIR))[0]


def central_public_key() -> str | None:
    """Central's public key as this agent pins it; None when there is none to pin (orders are refused)."""
    from django.conf import settings

    if settings.GPUADMIN_CENTRAL_PUBLIC_KEY:
        return settings.GPUADMIN_CENTRAL_PUBLIC_KEY.strip()
    # One box: central's own key lies in the same data directory.
    path = Path(settings.GPUADMIN_SIGNING_KEY_PATH)
    if os.path.exists(path):
        return public_key_text(read_private_key(path))
    return None
