"""The JSON schemas a tool advertises, made from its operations' argument models, lean: a model
reads them on every turn, so each thing is said once and the detail lives in
docs/reference/tools.md (generated from the same models).

**Input.** One object for the whole tool: ``operation`` (an enum, required; its description
lists each operation once, as ``name(required arguments): what it does``) and every argument of
every operation, by name and type only (what each means, and its default, is in the reference).
Every argument but ``operation`` is optional and nullable: null means unset, and a field an
operation does not use may be omitted or null (``call_tool`` drops those; see
docs/tool-contract.md).

The shape is the one every stack driven in tests/frameworks accepts:

- a flat ``type`` list with ``"null"`` in it, and ``nullable: true`` beside it (smolagents
  reads ``type`` alone, refuses ``anyOf``, and takes a field as optional only when it is
  ``nullable``); ``"integer"`` beside every ``"number"`` (smolagents refuses 600 for a list
  holding only ``"number"``);
- OpenAI strict mode's rules (openai-agents ``ensure_strict_json_schema`` makes every field
  required): no ``default`` keyword (the default is in the description), no open maps (a
  str-to-str map such as ``env`` is advertised as a list of ``NAME=value`` strings; the map, and
  a list of ``{name, value}`` objects, are accepted too), no ``$ref``, and
  ``additionalProperties: false`` on every object.

**Output.** An open object that requires ``success``: the fields of each operation's result
are listed in docs/reference/tools.md (a schema of each would cost more than the whole list may),
and with no ``properties`` a client that builds a type from the schema (fastmcp's ``.data``)
gets the result whole, as a dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel


class _Operation(Protocol):
    """What the schemas read of an operation (``tools._base.Operation``, which builds its tool's
    schemas from here: a protocol, so this module needs nothing of it)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def args(self) -> type[BaseModel]: ...


NULL = {"type": "null"}
# A str-to-str map as strict schemas can say it, in the fewest bytes: ["NAME=value", ...].
ASSIGNMENTS_SCHEMA: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
# Each argument name, with the operations that take it and their property schemas.
Uses = dict[str, list[tuple[str, dict[str, Any]]]]
# Keywords of a property schema that OpenAI's strict mode does not take, or that describe it
# rather than constrain it; the description says what they said.
_DROPPED = frozenset({"title", "default", "description"})


def input_schema(operations: Mapping[str, _Operation]) -> dict[str, Any]:
    """The tool's one input schema (see the module doc)."""
    uses = field_uses(operations)
    common = _required_by_all(operations, uses)
    listing = "; ".join(_signature(o, uses, common) for o in operations.values())
    if common:
        listing = f"All take {', '.join(common)}. {listing}"
    properties: dict[str, Any] = {
        "operation": {"type": "string", "enum": list(operations), "description": listing}
    }
    for name, field in uses.items():
        properties[name] = _advertised(field[0][1])
    return {
        "type": "object",
        "properties": properties,
        "required": ["operation"],
        "additionalProperties": False,
    }


def output_schema() -> dict[str, Any]:
    """Every result: an object with ``success``, open (no ``properties``), so a client that
    builds a type from the schema (fastmcp's ``.data``) keeps every field as it came."""
    return {"type": "object", "required": ["success"]}


def field_uses(operations: Mapping[str, _Operation]) -> Uses:
    """Each argument name, with the operations that take it and their property schemas."""
    uses: Uses = {}
    for operation in operations.values():
        schema = operation.args.model_json_schema()
        required = set(schema.get("required", ()))
        for name, prop in schema.get("properties", {}).items():
            use = {**prop, "_required": name in required}
            uses.setdefault(name, []).append((operation.name, use))
    return uses


def is_map(prop: Mapping[str, Any]) -> bool:
    """A str-to-str map (``dict[str, str]``, possibly nullable): advertised as a list of
    ``NAME=value`` strings."""
    branches = prop.get("anyOf", [prop])
    return any(
        b.get("type") == "object" and isinstance(b.get("additionalProperties"), dict)
        for b in branches
    )


def _required_by_all(operations: Mapping[str, _Operation], uses: Uses) -> list[str]:
    """Arguments every operation of a tool requires (said once, not per operation)."""
    if len(operations) < 2:
        return []
    return [
        name
        for name, field in uses.items()
        if len(field) == len(operations) and all(prop["_required"] for _, prop in field)
    ]


def _signature(operation: _Operation, uses: Uses, common: list[str]) -> str:
    """``name(required arguments): what it does``; the optional arguments' names say the rest
    (their meanings and defaults are in docs/reference/tools.md)."""
    required = [
        name
        for name, field in uses.items()
        for op, prop in field
        if op == operation.name and prop["_required"] and name not in common
    ]
    return f"{operation.name}({','.join(required)}): {operation.description}"


def _advertised(prop: dict[str, Any]) -> dict[str, Any]:
    core = ASSIGNMENTS_SCHEMA if is_map(prop) else _flat(prop)
    return {**_with_null(core), "nullable": True}


def _flat(prop: Mapping[str, Any]) -> dict[str, Any]:
    """The property without the keywords strict mode refuses and with its ``anyOf`` of plain
    types (``str | int``, ``float | None``) folded into one ``type`` list."""
    core = {k: v for k, v in prop.items() if k not in _DROPPED and not k.startswith("_")}
    branches = core.pop("anyOf", None)
    if branches is None:
        return core
    kept = [b for b in branches if b != NULL]
    if len(kept) == 1:
        return {**core, **kept[0]}
    if all(set(b) == {"type"} and isinstance(b["type"], str) for b in kept):
        return {**core, "type": [b["type"] for b in kept]}
    raise ValueError(f"an argument whose type no flat schema says: {prop}")


def _with_null(core: dict[str, Any]) -> dict[str, Any]:
    kind = core["type"]
    kinds = [kind] if isinstance(kind, str) else list(kind)
    if "number" in kinds and "integer" not in kinds:
        # smolagents takes an integer for "number" but not for a list holding "number".
        kinds.append("integer")
    nullable: dict[str, Any] = {**core, "type": [*kinds, "null"]}
    if "enum" in core:
        nullable["enum"] = [*core["enum"], None]
    return nullable
