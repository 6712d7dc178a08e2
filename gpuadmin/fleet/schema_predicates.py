"""Part of the snapshot schema as plain Python predicates: ``value -> bool``, True only when the
value is certainly valid.

A 200-process snapshot spends most of its schema check in the processes: fastjsonschema's
generated code runs about 25 us per process (a third of validation, ~5 ms per snapshot). The
predicates built here from the same schema file do the usual process in a fraction of that.
They know a small set of keywords (those the process definition uses); any other keyword, and
anything unusual (a float where an integer goes, an unhashable item under ``uniqueItems``), makes
the predicate answer False, and the caller falls back to the full check, which names the error.
So a predicate may refuse a valid value, never accept an invalid one:
tests/fleet/test_schema_predicates.py holds them to jsonschema's answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Any], bool]

# The types of containers; leaves (numbers, strings, booleans) are ``_scalar``'s, with their bounds.
_TYPES: dict[str, Callable[[Any], bool]] = {
    "array": lambda v: type(v) is list,
    "object": lambda v: type(v) is dict,
    "null": lambda v: v is None,
}
# Read for people or tools only; they constrain nothing.
_ANNOTATIONS = frozenset({"description", "title", "$comment", "examples"})


def _never(_: Any) -> bool:
    return False


def _always(_: Any) -> bool:
    return True


def predicate(schema: Any, definitions: Mapping[str, Any]) -> Predicate:
    """A predicate for ``schema`` (whose ``$ref``s point into ``definitions``, the ``$defs``)."""
    if schema is True or schema == {}:
        return _always
    if not isinstance(schema, dict):
        return _never
    keywords = schema.keys() - _ANNOTATIONS
    if keywords & {"$ref", "anyOf"}:
        return _reference_or_choice(schema, keywords, definitions)
    leaf = _scalar(schema, keywords)
    if leaf is not None:
        return leaf
    checks: list[Predicate] = []
    if keywords & _OBJECT_KEYWORDS:
        checks.append(_object(schema, definitions))
    if keywords & _ARRAY_KEYWORDS:
        checks.append(_array(schema, definitions))
    for keyword in keywords - _OBJECT_KEYWORDS - _ARRAY_KEYWORDS:
        build = _KEYWORDS.get(keyword)
        # A keyword not known here: the full check decides.
        checks.append(build(schema) if build is not None else _never)
    return _all(checks)


def _reference_or_choice(
    schema: dict[str, Any], keywords: set[str], definitions: Mapping[str, Any]
) -> Predicate:
    """``{"$ref": "#/$defs/name"}`` or ``{"anyOf": [...]}``, each alone in its schema."""
    prefix = "#/$defs/"
    ref = schema.get("$ref")
    if keywords == {"$ref"} and isinstance(ref, str) and ref.startswith(prefix):
        return predicate(definitions.get(ref[len(prefix):]), definitions)
    if keywords == {"anyOf"}:
        options = [predicate(option, definitions) for option in schema["anyOf"]]
        return lambda v: any(option(v) for option in options)
    return _never


def _scalar(schema: dict[str, Any], keywords: set[str]) -> Predicate | None:
    """One predicate for a leaf: a number, a string or a boolean (or null) with its bounds; None for
    anything else. Strict, as validation's own integer check: True and 1.0 are no integers."""
    names = schema.get("type")
    names = set(names) if isinstance(names, list) else {names}
    nullable = "null" in names
    names.discard("null")
    if names in ({"integer"}, {"number"}) and keywords <= {"type", "minimum", "maximum"}:
        low = schema.get("minimum", float("-inf"))
        high = schema.get("maximum", float("inf"))
        if names == {"integer"}:
            return lambda v: (type(v) is int and low <= v <= high) or (nullable and v is None)
        return lambda v: (((type(v) is int or type(v) is float) and low <= v <= high)
                          or (nullable and v is None))
    if names == {"string"} and keywords <= {"type", "maxLength", "pattern"}:
        most = schema.get("maxLength", float("inf"))
        if "pattern" not in schema:
            return lambda v: (type(v) is str and len(v) <= most) or (nullable and v is None)
        # Searched, as JSON Schema (and jsonschema) read a pattern; ours are anchored.
        search = re.compile(schema["pattern"]).search
        return lambda v: ((type(v) is str and len(v) <= most and search(v) is not None)
                          or (nullable and v is None))
    if names == {"boolean"} and keywords == {"type"}:
        return lambda v: type(v) is bool or (nullable and v is None)
    return None


def _all(checks: list[Predicate]) -> Predicate:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda v: first(v) and second(v)
    return lambda v: all(check(v) for check in checks)


def _type(schema: dict[str, Any]) -> Predicate:
    """The type of a container (an object or an array; leaves are ``_scalar``'s)."""
    names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if any(name not in _TYPES for name in names):
        return _never
    tests = [_TYPES[name] for name in names]
    if len(tests) == 1:
        return tests[0]
    return lambda v: any(test(v) for test in tests)


def _enum(schema: dict[str, Any]) -> Predicate:
    # Equal and of the same type: 1 == True == 1.0 in Python, not in JSON.
    allowed = frozenset((type(value), value) for value in schema["enum"])
    return lambda v: (type(v), v) in allowed if v is None or type(v) in (str, int, bool) else False


# The keywords one object check reads together.
_OBJECT_KEYWORDS = frozenset({"properties", "required", "additionalProperties", "maxProperties"})


def _object(schema: dict[str, Any], definitions: Mapping[str, Any]) -> Predicate:
    properties = {name: predicate(sub, definitions) for name, sub in schema.get("properties", {}).items()}
    required = frozenset(schema.get("required", ()))
    extra_schema = schema.get("additionalProperties", True)
    extra = None if extra_schema is False else predicate(extra_schema, definitions)
    most = schema.get("maxProperties")

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return True  # "type" says whether it must be an object
        if not required <= v.keys() or (most is not None and len(v) > most):
            return False
        for name, value in v.items():
            known = properties.get(name)
            if known is not None:
                if not known(value):
                    return False
            elif extra is None or not extra(value):
                return False
        return True

    return check


# The keywords one array check reads together.
_ARRAY_KEYWORDS = frozenset({"items", "maxItems", "uniqueItems"})


def _array(schema: dict[str, Any], definitions: Mapping[str, Any]) -> Predicate:
    item = predicate(schema.get("items", True), definitions)
    most = schema.get("maxItems")
    unique = schema.get("uniqueItems", False)

    def check(v: Any) -> bool:
        if type(v) is not list:
            return True
        if most is not None and len(v) > most:
            return False
        # Unique strings only: other items (numbers equal across types, say) go to the full check.
        if unique and (not all(type(x) is str for x in v) or len(set(v)) != len(v)):
            return False
        return all(item(x) for x in v)

    return check


_KEYWORDS: dict[str, Callable[[dict[str, Any]], Predicate]] = {"type": _type, "enum": _enum}
