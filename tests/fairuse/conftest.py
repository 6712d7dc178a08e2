"""Fixtures for fair use: the orders central sends (kills' recorder); people come from tests/people.py."""

from __future__ import annotations

from tests.kills.helpers import sent  # noqa: F401 - a fixture
