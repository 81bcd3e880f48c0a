"""Markdown pieces of the generated pages: tables, and a JSON schema read as a type, a default
and its bounds. Pure: the same models give the same text, byte for byte, so a test can compare a
regenerated page with the committed one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic.fields import FieldInfo

# Keywords of a JSON schema that bound a value, and how the page says each.
_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
)


def cell(text: str) -> str:
    """Text that stays inside one table cell."""
    return text.replace("|", "\\|").replace("\n", " ").strip()


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def literal(value: Any) -> str:
    """A value as JSON in a code span (tuples as arrays)."""
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def type_of(schema: Mapping[str, Any], *, nullable: bool = True) -> str:
    """How a JSON schema reads as a type: ``string``, ``array of string``, an enum's values,
    ``FileEntry`` for a reference; ``nullable=False`` leaves out a null branch."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "const" in schema:
        return literal(schema["const"])
    if "enum" in schema:
        return " or ".join(literal(value) for value in schema["enum"])
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if nullable or b.get("type") != "null"]
        return " or ".join(dict.fromkeys(type_of(b) for b in branches))
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind if nullable or k != "null")
    if kind == "array":
        items = schema.get("items")
        return f"array of {type_of(items)}" if isinstance(items, Mapping) else "array"
    if kind == "object":
        values = schema.get("additionalProperties")
        return f"object of {type_of(values)}" if isinstance(values, Mapping) else "object"
    return str(kind) if kind else "any"


def bounds_of(schema: Mapping[str, Any]) -> str:
    """The bounds a schema sets on its value (and on each item of an array), or ""."""
    said = [text.format(schema[key]) for key, text in _BOUNDS if key in schema]
    if "pattern" in schema:
        said.append(f"matching `{schema['pattern']}`")
    for branch in schema.get("anyOf", ()):
        if (inner := bounds_of(branch)) and branch.get("type") != "null":
            said.append(inner)
    items = schema.get("items")
    if isinstance(items, Mapping) and (inner := bounds_of(items)):
        said.append(f"each {inner}")
    return ", ".join(said)


def default_of(field: FieldInfo, *, unset: str = "`null`") -> str:
    """A field's default as JSON, ``unset`` for None, or "required"."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return unset
    if hasattr(value, "model_dump"):
        return "its section's defaults"
    return literal(list(value) if isinstance(value, tuple) else value)
