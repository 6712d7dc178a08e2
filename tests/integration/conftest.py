"""Fixtures for the integration tests: real workers over a real redis-server (see helpers.py)."""

from tests.integration.helpers import publish_to, start_worker  # noqa: F401 - fixtures
