"""Fixtures for the integration tests: real workers over a real redis-server (see helpers.py)."""

from tests.integration.helpers import own_redis, publish_to, start_worker  # noqa: F401 - fixtures
