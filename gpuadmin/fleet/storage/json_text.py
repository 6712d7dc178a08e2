"""A JSON document kept as text: ``JsonTextField`` (a host's latest snapshot document).

A text column on every database, not PostgreSQL's ``jsonb``: nothing queries
inside the latest document in SQL (every reader loads it whole into Python),
and it is rewritten by every accepted snapshot. jsonb makes the server parse
and rebuild ~125 KB on each write; text is stored as it comes, compressed with
lz4 where the server has it (migration 0008, ``fleet.storage.table_settings``): of jsonb, text
and lz4 text, the cheapest to rewrite at every snapshot.

Reads give the parsed document, as a ``JSONField`` does (``decode_document``). Writes take either a
document, encoded once, or ``ValidatedJson``: the text ingest already
validated as the document it stands for, stored as it is. Only that marker
type passes through: a plain ``str`` is a document like any other (a JSON
string), so text from elsewhere can never land in the column unchecked.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Expression, Model


class ValidatedJson(str):
    """JSON text that ``parse_snapshot`` accepted, stored as it is (no second encoding).

    Make one only from text that was validated as the very document it is
    stored for: the column then holds whatever it says.
    """

    __slots__ = ()


def encode_document(document: Any) -> str:
    """The compact JSON text of a document (strict JSON: no NaN or infinities)."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode_document(text: str) -> Any:
    """The document a stored text is."""
    return json.loads(text)


class JsonTextField(models.TextField):
    """A JSON document in a text column: read as the parsed document, written as its text."""

    description = "A JSON document, stored as text"

    if TYPE_CHECKING:
        # What the model attribute holds for the type checker: the document, as for a JSONField.
        _pyi_private_set_type: Any
        _pyi_private_get_type: Any

    def from_db_value(self, value: str | None, expression: Expression,
                      connection: BaseDatabaseWrapper) -> Any:
        return None if value is None else decode_document(value)

    def to_python(self, value: Any) -> Any:
        # The value is the document already (a fixture's or a form's): nothing to convert.
        return value

    def get_prep_value(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, ValidatedJson):
            return str.__str__(value)  # a plain str for the database driver
        return encode_document(value)

    def value_to_string(self, obj: Model) -> Any:
        # As JSONField: a serializer (dumpdata) writes the document itself, not its text in a string.
        return self.value_from_object(obj)
