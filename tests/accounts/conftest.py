"""Fixtures for the account tests; approving needs the lab host and a record of sent orders."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kills.helpers import lab, protect_like_the_lab, sent  # noqa: F401 - lab, sent: fixtures


@pytest.fixture(autouse=True)
def _lab_protections(settings: Any) -> None:
    protect_like_the_lab(settings)
