"""The embedded broker used when there is no REDIS_URL (see docs/broker.md)."""
