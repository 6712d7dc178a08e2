"""A snapshot's ``taken_at`` (the host's clock), read from its text or from a stored document.

Below the models and validation both: the models read a stored document's time
(the host's clock offset), validation checks a new one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any


def parse_taken_at(text: str) -> datetime:
    """taken_at as an aware UTC datetime (the schema's pattern already holds)."""
    # More than 6 fractional digits are legal ISO 8601 but not datetime's business.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    return datetime.fromisoformat(text).astimezone(UTC)


def document_taken_at(document: dict[str, Any]) -> datetime | None:
    """A stored document's taken_at as an aware UTC datetime; None when it has none that parses."""
    try:
        return parse_taken_at(document["taken_at"])
    except (KeyError, TypeError, ValueError):
        return None
