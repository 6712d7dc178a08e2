"""Celery tasks (filled in by its issue)."""
