"""The snapshot schema as msgspec types: one pass in C over the JSON text that parses and checks.

Parsing with ``json`` and then checking in Python walks every value twice; msgspec's decoder, given
types built here from the same schema file, parses and checks in one pass (what that is worth:
benchmarks/README.md, "What each performance mechanism is worth"). The check is never more lenient
than jsonschema, which
has the last word: what it accepts is valid; what it refuses goes to the full check, which names
the error. So each keyword is expressed exactly or more strictly:

- integers and numbers are bounded by ``largest_number`` (validation's 64 bits: it refuses bigger
  ones anyway);
- ``if``/``then`` on a ``const`` (schema version 2 requires owners) accepts only documents the
  condition holds for, with ``then`` applied; an older version gets its own types, built from
  ``for_property_value`` (``validation.quick_snapshot_decoder``);
- ``uniqueItems`` (msgspec has no such constraint) is checked after decoding, on the few arrays
  that carry it, and only for strings and integers; in an array of objects, for all the objects'
  arrays at once (``_Unique``: a process's reasons);
- ``format`` is not checked, as jsonschema does not check it (``validation.snapshot_validator``);
- a ``pattern`` that is one character class repeated (``^[0-9a-f]{64}$``, ``^[A-Za-z]$``) becomes
  the length it implies and a check of the characters, made over all the strings of an array at
  once, where msgspec would call the regex once per value, and a process has two such values
  (``_Characters``). Any other pattern is msgspec's, as ``python_pattern`` spells it: its ``$`` is
  the end of the text, as in JSON Schema, not also before a final newline as in Python;
- a keyword not known here raises ``Unsupported`` when the check is built: tests build it from the
  shipped schema, so the schema file stays the one place the snapshot's shape is written.

tests/fleet/intake/test_schema_types.py holds the check to jsonschema's answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import count
from operator import attrgetter
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

# What a decoded value must still pass beyond its type (``uniqueItems``); None when nothing.
Check = Callable[[Any], bool] | None
# A JSON Schema as a msgspec type, and what a value of it must still pass.
Built = tuple[Any, Check]

_REF_PREFIX = "#/$defs/"
# Read for people or tools only: they constrain nothing. ``format`` is one here, as in jsonschema,
# whose answer is final.
_ANNOTATIONS = frozenset({"description", "title", "$comment", "examples", "format"})
_SCALAR_KEYWORDS = frozenset({"type", "minimum", "maximum", "minLength", "maxLength", "pattern"})
_OBJECT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "maxProperties",
                              "propertyNames"})
_ARRAY_KEYWORDS = frozenset({"type", "items", "maxItems", "uniqueItems"})


class Unsupported(ValueError):
    """The schema uses something these types cannot say exactly or more strictly."""


# What a checked decoder gives for a text it cannot vouch for.
NOT_VALID: Any = object()


def checked_json_decoder(schema: dict[str, Any], *, largest_number: int) -> Callable[[str | bytes], Any]:
    """``text -> value``: the JSON value of ``text`` as plain Python values, equal to what
    ``msgspec.json.decode`` gives (dicts, lists, str, int, float, bool, None), only when ``text`` is
    valid under ``schema`` with no number beyond ``largest_number`` either way; else ``NOT_VALID``
    (which may still be valid: the full check decides). One pass of msgspec parses and checks; the
    checked value is turned into plain values in C. Raises ``Unsupported`` for a schema it cannot
    express."""
    root = {k: v for k, v in schema.items() if k not in {"$schema", "$id", "$defs"}}
    root_type, check = _Builder(schema.get("$defs", {}), largest_number).built(root)
    decode = msgspec.json.Decoder(root_type).decode
    to_builtins = msgspec.to_builtins

    def checked(text: str | bytes) -> Any:
        try:
            value = decode(text)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeEncodeError):
            # UnicodeEncodeError: a str with a raw lone surrogate, which is no UTF-8 text.
            return NOT_VALID
        if check is not None and not check(value):
            return NOT_VALID
        # Objects are Structs named by the schema's property names: back to dicts, an absent
        # property (UNSET) absent again.
        return to_builtins(value)

    return checked


def for_property_value(schema: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """``schema`` as it reads for the documents whose top-level property ``name`` is ``value``: that
    property a ``const``, and an ``if`` on another value of it left out with its ``then``, which does
    not apply to them (``checked_json_decoder`` builds one ``if`` only as its condition holding). A
    copy; ``schema`` is left as it is."""
    fixed = {**schema, "properties": {**schema["properties"], name: {"const": value}}}
    if "else" not in schema and _const_condition(schema.get("if"), name) not in (None, {"const": value}):
        del fixed["if"]
        fixed.pop("then", None)
    return fixed


def _const_condition(condition: Any, name: str) -> dict[str, Any] | None:
    """``{"const": c}`` when ``condition`` (an ``if``) is ``{"properties": {name: {"const": c}}}``."""
    if not isinstance(condition, dict) or condition.keys() != {"properties"}:
        return None
    properties = condition["properties"]
    if not isinstance(properties, dict) or properties.keys() != {name}:
        return None
    rule = properties[name]
    return rule if isinstance(rule, dict) and rule.keys() == {"const"} else None


class _Builder:
    def __init__(self, definitions: Mapping[str, Any], largest_number: int) -> None:
        self.definitions = definitions
        self.largest_number = largest_number
        self.references: dict[str, Built] = {}
        self.names = count()

    def built(self, schema: Any) -> Built:
        if not isinstance(schema, dict) or not schema.keys() - _ANNOTATIONS:
            # Unconstrained (true, {}): msgspec's Any would take a number beyond 64 bits unseen.
            raise Unsupported(f"schema {schema!r}: any value")
        keywords = schema.keys() - _ANNOTATIONS
        if "$ref" in keywords:
            return self._reference(schema, keywords)
        if "anyOf" in keywords:
            return self._choice(schema, keywords)
        if "if" in keywords:
            return self._conditional(schema)
        if keywords in ({"enum"}, {"const"}):
            return _literal(schema["enum"] if "enum" in schema else [schema["const"]]), None
        return self._typed(schema, keywords)

    def _typed(self, schema: dict[str, Any], keywords: set[str]) -> Built:
        """A schema with a ``type``: a container or a leaf, perhaps nullable."""
        types = schema.get("type")
        names = set(types) if isinstance(types, list) else {types}
        nullable = "null" in names
        names.discard("null")
        if not names and nullable and keywords == {"type"}:
            return None, None
        if len(names) != 1:
            raise Unsupported(f"type {types!r}")
        (name,) = names
        if name == "object":
            built, check = self._object(schema, keywords)
        elif name == "array":
            built, check = self._array(schema, keywords)
        else:
            built, check = _scalar(name, schema, keywords, self.largest_number)
        if not nullable:
            return built, check
        built, check = _searched((built, check))
        return built | None, (None if check is None else _or_none(check))

    def _reference(self, schema: dict[str, Any], keywords: set[str]) -> Built:
        ref = schema["$ref"]
        if keywords != {"$ref"} or not isinstance(ref, str) or not ref.startswith(_REF_PREFIX):
            raise Unsupported(f"$ref {ref!r} beside {sorted(keywords - {'$ref'})}")
        if ref not in self.references:
            self.references[ref] = self.built(self._definition(ref))
        return self.references[ref]

    def _definition(self, ref: str) -> dict[str, Any]:
        """The schema ``#/$defs/<name>`` points to."""
        definition = self.definitions.get(ref[len(_REF_PREFIX):]) if ref.startswith(_REF_PREFIX) else None
        if not isinstance(definition, dict):
            raise Unsupported(f"$ref {ref!r} to nothing")
        return definition

    def _choice(self, schema: dict[str, Any], keywords: set[str]) -> Built:
        if keywords != {"anyOf"}:
            raise Unsupported(f"anyOf beside {sorted(keywords - {'anyOf'})}")
        options = [_searched(self.built(option)) for option in schema["anyOf"]]
        if any(check is not None for _, check in options):
            raise Unsupported("anyOf over a uniqueItems array")
        return Union[tuple(option for option, _ in options)], None  # noqa: UP007 - built at run time

    def _conditional(self, schema: dict[str, Any]) -> Built:
        """``if: {properties: {name: {const: c}}}, then: {...}``: only documents whose ``name`` is
        ``c``, with ``then`` merged into their schema."""
        condition, consequence = schema["if"], schema.get("then", {})
        if "else" in schema or not isinstance(condition, dict) or set(condition) != {"properties"}:
            raise Unsupported(f"if {condition!r}")
        conditioned = condition["properties"]
        if not isinstance(conditioned, dict) or len(conditioned) != 1:
            raise Unsupported(f"if {condition!r}")
        ((name, rule),) = conditioned.items()
        if set(rule) != {"const"}:
            raise Unsupported(f"if {condition!r}")
        merged = self._merged({k: v for k, v in schema.items() if k not in {"if", "then"}}, consequence)
        merged["properties"][name] = {"const": rule["const"]}
        return self.built(merged)

    def _merged(self, base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """``base`` with ``extra``'s keywords added (``then`` over the schema it applies to): nested
        ``properties``/``items`` merged, ``required`` lists joined, a ``$ref`` in ``base`` inlined."""
        ref = base.get("$ref")
        if isinstance(ref, str) and extra:
            base = {**self._definition(ref), **{k: v for k, v in base.items() if k != "$ref"}}
        merged = dict(base)
        for keyword, value in extra.items():
            if keyword == "properties":
                properties = dict(merged.get("properties", {}))
                for name, sub in value.items():
                    properties[name] = self._merged(properties.get(name, {}), sub)
                merged["properties"] = properties
            elif keyword == "items":
                merged["items"] = self._merged(merged.get("items", {}), value)
            elif keyword == "required":
                before = list(merged.get("required", ()))
                merged["required"] = before + [name for name in value if name not in before]
            elif keyword in merged and merged[keyword] != value:
                raise Unsupported(f"then changes {keyword!r}")
            else:
                merged[keyword] = value
        return merged

    def _object(self, schema: dict[str, Any], keywords: set[str]) -> Built:
        if not keywords <= _OBJECT_KEYWORDS:
            raise Unsupported(f"object keywords {sorted(keywords - _OBJECT_KEYWORDS)}")
        if "properties" not in schema:
            return self._mapping(schema)
        if schema.get("additionalProperties", True) is not False or keywords & {"maxProperties",
                                                                                "propertyNames"}:
            raise Unsupported("properties with additionalProperties, maxProperties or propertyNames")
        required = set(schema.get("required", ()))
        if required - set(schema["properties"]):
            raise Unsupported(f"required, not described: {sorted(required - set(schema['properties']))}")
        fields: list[tuple[str, Any, Any]] = []
        checks: list[tuple[str, Callable[[Any], bool]]] = []
        for n, (name, subschema) in enumerate(schema["properties"].items()):
            # Attributes are f0, f1...: a JSON name need not be an identifier.
            attribute = f"f{n}"
            field_type, check = self.built(subschema)
            if name in required:
                fields.append((attribute, field_type, msgspec.field(name=name)))
            else:
                # UNSET, not None: absent and null are different values to the schema.
                field_type, check = _searched((field_type, check))
                fields.append((attribute, field_type | msgspec.UnsetType,
                               msgspec.field(name=name, default=msgspec.UNSET)))
                check = None if check is None else _or_unset(check)
            if check is not None:
                checks.append((attribute, check))
        struct = msgspec.defstruct(f"Object{next(self.names)}", fields, kw_only=True,
                                   forbid_unknown_fields=True)
        return struct, (_StructCheck(checks) if checks else None)

    def _mapping(self, schema: dict[str, Any]) -> Built:
        """An object without named properties: its keys strings, or the words propertyNames allows."""
        key: Any = str
        names = schema.get("propertyNames")
        if names is not None:
            if not isinstance(names, dict) or names.keys() - _ANNOTATIONS != {"enum"}:
                raise Unsupported(f"propertyNames {names!r}")
            key = _literal(names["enum"])
        value_type, check = _searched(self.built(schema.get("additionalProperties", {})))
        if check is not None:
            raise Unsupported("a mapping of uniqueItems arrays")
        mapping: Any = dict[key, value_type]  # type: ignore[valid-type]
        most = schema.get("maxProperties")
        return (mapping if most is None else Annotated[mapping, msgspec.Meta(max_length=most)]), None

    def _array(self, schema: dict[str, Any], keywords: set[str]) -> Built:
        if not keywords <= _ARRAY_KEYWORDS:
            raise Unsupported(f"array keywords {sorted(keywords - _ARRAY_KEYWORDS)}")
        item_type, item_check = self.built(schema.get("items", {}))
        array: Any = list[item_type]  # type: ignore[valid-type]
        most = schema.get("maxItems")
        if most is not None:
            array = Annotated[array, msgspec.Meta(max_length=most)]
        if schema.get("uniqueItems"):
            if item_check is not None:
                raise Unsupported("uniqueItems over arrays")
            return array, _Unique(typed=_only_strings_and_integers(item_type))
        if isinstance(item_check, _Batchable):
            return array, item_check.over_items
        return array, (None if item_check is None else _items_pass(item_check))


def _scalar(name: str, schema: dict[str, Any], keywords: set[str], largest: int) -> Built:
    if not keywords <= _SCALAR_KEYWORDS:
        raise Unsupported(f"{name} keywords {sorted(keywords - _SCALAR_KEYWORDS)}")
    if name in {"integer", "number"} and not keywords & {"minLength", "maxLength", "pattern"}:
        low = max(schema.get("minimum", -largest), -largest)
        high = min(schema.get("maximum", largest), largest)
        # msgspec's int refuses 1.0 and true, as validation's strict integers do. A "number" takes
        # JSON's integers too, kept as int (not turned into float) as a plain decode keeps them.
        bounds = msgspec.Meta(ge=low, le=high)
        if name == "integer":
            return Annotated[int, bounds], None
        return Union[Annotated[int, bounds], Annotated[float, bounds]], None  # noqa: UP007 - built at run time
    if name == "string" and not keywords & {"minimum", "maximum"}:
        shortest, longest = schema.get("minLength"), schema.get("maxLength")
        pattern = schema.get("pattern")
        repeated = None if pattern is None else _CLASS_REPEATED.fullmatch(pattern)
        spelled = None if pattern is None else python_pattern(pattern)
        if repeated is None:
            if spelled is not None:
                re.compile(spelled)  # searched, as JSON Schema reads a pattern (ours are anchored)
            meta = msgspec.Meta(min_length=shortest, max_length=longest, pattern=spelled)
            return Annotated[str, meta], None
        # One class, n to m times, anchored: a length of n to m, each character in the class.
        if repeated["times"] is not None:
            at_least = int(repeated["times"])
            at_most = None if repeated["comma"] else at_least
            if repeated["most"]:
                at_most = int(repeated["most"])
        else:
            at_least, at_most = {"": (1, 1), "+": (1, None), "*": (0, None)}[repeated["sign"]]
        shortest = max(shortest or 0, at_least) or None
        longest = at_most if longest is None else (longest if at_most is None else min(longest, at_most))
        searched = Annotated[str, msgspec.Meta(min_length=shortest, max_length=longest, pattern=spelled)]
        return (Annotated[str, msgspec.Meta(min_length=shortest, max_length=longest)],
                _Characters(re.compile(f"{repeated['class']}*"), searched))
    if name == "boolean" and keywords == {"type"}:
        return bool, None
    raise Unsupported(f"type {name!r} with {sorted(keywords)}")


def python_pattern(pattern: str) -> str:
    """A JSON Schema ``pattern`` spelled for Python's ``re``, to be searched as JSON Schema searches it.

    In ECMA-262, which JSON Schema's patterns follow, ``$`` is the end of the text; Python's ``$`` also
    matches before a final newline, so ``^[a-z0-9]+$`` took "gpu01\\n". Each ``$`` that is an anchor
    (not escaped, not in a character class) becomes ``\\Z``, Python's end of the text. Built once per
    check, never per value.
    """
    spelled: list[str] = []
    escaped = in_class = False
    first = 0  # where the current class's members start: a "]" there is one of them
    for i, char in enumerate(pattern):
        anchor = False
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]" or i == first
        elif char == "[":
            in_class, first = True, i + 1 + pattern.startswith("^", i + 1)
        else:
            anchor = char == "$"
        spelled.append(r"\Z" if anchor else char)
    return "".join(spelled)


# A pattern that is one character class, without escapes or nested brackets, repeated:
# ``^[...]$``, ``^[...]+$``, ``^[...]*$``, ``^[...]{n}$``, ``^[...]{n,}$``, ``^[...]{n,m}$``.
_CLASS_REPEATED = re.compile(
    r"\^(?P<class>\[\^?[^\[\]\\]+\])(?:\{(?P<times>\d+)(?P<comma>,(?P<most>\d+)?)?\}|(?P<sign>[+*]?))\$"
)


def _literal(values: Any) -> Any:
    # Strings, integers and null only: msgspec's Literal tells 1 from true and 1.0, as JSON does.
    if not isinstance(values, list) or not values or any(
        not (value is None or type(value) in (str, int)) for value in values
    ):
        raise Unsupported(f"enum {values!r}")
    return Literal[tuple(values)]


# --- what a decoded value must still pass ----------------------------------------------------


class _Batchable:
    """A check that also judges many values at once (``over_items``): the values of one attribute
    of every Struct of an array (``_StructCheck``), or the items of an array. A process has three
    (its state, command-line digest and reasons): checked one by one, ~200 processes cost ~3 Python
    calls each per snapshot."""

    def __call__(self, value: Any) -> bool:
        return self.over_items([value])

    def over_items(self, values: list[Any]) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class _Unique(_Batchable):
    """``uniqueItems``: no item twice. Only arrays of strings and integers (and null): JSON's equality
    of other values (1 and 1.0 equal, true and 1 not) is the full check's business. ``typed``: msgspec
    decodes the items as nothing else (an enum's, a string's or an integer's type), so the items'
    types need no look. Over many arrays, counted in C."""

    typed: bool

    def over_items(self, values: list[Any]) -> bool:
        if not self.typed and not all(type(item) in (str, int) for items in values for item in items):
            return False
        return sum(map(len, values)) == sum(map(len, map(set, values)))


@dataclass(frozen=True)
class _Or(_Batchable):
    """``check``, or the value ``passing``: None for a nullable type, UNSET for an optional property."""

    passing: Any
    check: _Batchable

    def __call__(self, value: Any) -> bool:
        return value is self.passing or self.check(value)

    def over_items(self, values: list[Any]) -> bool:
        passing = self.passing
        return self.check.over_items([value for value in values if value is not passing])


def _or_none(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return _Or(None, check) if isinstance(check, _Batchable) else lambda value: value is None or check(value)


def _or_unset(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    if isinstance(check, _Batchable):
        return _Or(msgspec.UNSET, check)
    return lambda value: value is msgspec.UNSET or check(value)


def _only_strings_and_integers(item_type: Any) -> bool:
    """Whether msgspec decodes a value of ``item_type`` as a str, an int or None only."""
    if get_origin(item_type) is Annotated:
        item_type = get_args(item_type)[0]
    return item_type in (str, int) or get_origin(item_type) is Literal  # _literal's: str, int, None


def _items_pass(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda items: all(check(item) for item in items)


def _attributes_pass(checks: list[tuple[str, Callable[[Any], bool]]]) -> Callable[[Any], bool]:
    if len(checks) == 1:
        ((attribute, check),) = checks
        return lambda value: check(getattr(value, attribute))
    return lambda value: all(check(getattr(value, attribute)) for attribute, check in checks)


@dataclass(frozen=True)
class _Characters(_Batchable):
    """Every character of a string in one class (its length is the type's): over an array, one
    search of all its strings joined, which says the same as one search each."""

    allowed: re.Pattern[str]  # the class, any number of times
    searched: Any  # the same string type with msgspec searching the pattern, for a lone value

    def __call__(self, text: str) -> bool:
        return self.allowed.fullmatch(text) is not None

    def over_items(self, texts: list[str]) -> bool:
        return self.allowed.fullmatch("".join(texts)) is not None


def _searched(built: Built) -> Built:
    """``built``, but a string of one character class searched by msgspec as it decodes: where the
    value may be null, absent or of another type, checking its characters after decoding would cost a
    Python call per value, more than msgspec's search."""
    check = built[1]
    return (check.searched, None) if isinstance(check, _Characters) else built


class _StructCheck(_Batchable):
    """What a Struct's attributes must still pass. Over an array of Structs, each attribute whose check
    is ``_Batchable`` (a nested object's among them) is checked for all items at once."""

    def __init__(self, checks: list[tuple[str, Callable[[Any], bool]]]) -> None:
        self.batched = [(attrgetter(attribute), check) for attribute, check in checks
                        if isinstance(check, _Batchable)]
        others = [(attribute, check) for attribute, check in checks if not isinstance(check, _Batchable)]
        self.others = _attributes_pass(others) if others else None
        self.each = _attributes_pass(checks)

    def __call__(self, value: Any) -> bool:
        return self.each(value)

    def over_items(self, items: list[Any]) -> bool:
        if not all(check.over_items(list(map(get, items))) for get, check in self.batched):
            return False
        others = self.others
        return others is None or all(others(item) for item in items)
