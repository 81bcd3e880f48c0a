"""The JSON schemas a tool advertises, made from its operations' argument models.

**Input.** One object for the whole tool: ``operation`` (an enum, required) and every argument
of every operation. Each argument says which operations use it and which require it, and is
nullable: null means unset, and a field an operation does not use may be omitted, null, or its
advertised default (``call_tool`` drops those; see docs/tool-contract.md). The shape passes
OpenAI's strict-mode conversion (openai-agents ``ensure_strict_json_schema``), which makes every
field required: no ``default`` keyword (the default is in the description), no open maps (a
str-to-str map such as ``env`` is advertised as a list of ``{name, value}`` pairs; the map is
accepted too), no ``$ref``, and ``additionalProperties: false`` on every object.

**Output.** The envelope every result of the tool shares (``success``, ``operation``, the
error pair, the ids); operations add their own fields, so the envelope stays open.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.tools._base import Operation

NULL = {"type": "null"}
PAIRS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
        "required": ["name", "value"],
        "additionalProperties": False,
    },
}
_NULLABLE_TEXT = {"type": ["string", "null"]}
# Keywords of a property schema that OpenAI's strict mode does not take, or that describe it
# rather than constrain it; the description says what they said.
_DROPPED = frozenset({"title", "default"})


def input_schema(tool_description: str, operations: Mapping[str, Operation]) -> dict[str, Any]:
    """The tool's one input schema (see the module doc)."""
    properties: dict[str, Any] = {
        "operation": {
            "type": "string",
            "enum": list(operations),
            "description": "; ".join(f"{o.name}: {o.description}" for o in operations.values()),
        }
    }
    for name, uses in field_uses(operations).items():
        properties[name] = _advertised(uses[0][1], _described(uses))
    return {
        "type": "object",
        "properties": properties,
        "required": ["operation"],
        "additionalProperties": False,
    }


def output_schema() -> dict[str, Any]:
    """The envelope of every result; each operation adds its own fields."""
    return {
        "type": "object",
        "properties": {
            "success": {"type": "boolean", "description": "Whether the operation succeeded."},
            "operation": {**_NULLABLE_TEXT, "description": "The operation called."},
            "error_type": {**_NULLABLE_TEXT, "description": "A stable code, on failure."},
            "error_message": {**_NULLABLE_TEXT, "description": "For people, on failure."},
            "session_id": {**_NULLABLE_TEXT, "description": "The session the call used."},
            "unicode_replaced": {
                "type": "boolean",
                "description": "Set when text no UTF-8 can carry was replaced by U+FFFD.",
            },
        },
        "required": ["success"],
    }


def field_uses(operations: Mapping[str, Operation]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Each argument name, with the operations that take it and their property schemas."""
    uses: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for operation in operations.values():
        schema = operation.args.model_json_schema()
        required = set(schema.get("required", ()))
        for name, prop in schema.get("properties", {}).items():
            use = {**prop, "_required": name in required}
            uses.setdefault(name, []).append((operation.name, use))
    return uses


def is_map(prop: Mapping[str, Any]) -> bool:
    """A str-to-str map (``dict[str, str]``, possibly nullable): advertised as pairs."""
    branches = prop.get("anyOf", [prop])
    return any(
        b.get("type") == "object" and isinstance(b.get("additionalProperties"), dict)
        for b in branches
    )


def _advertised(prop: dict[str, Any], description: str) -> dict[str, Any]:
    core = {k: v for k, v in prop.items() if k not in _DROPPED and not k.startswith("_")}
    core.pop("description", None)
    if is_map(prop):
        core = {"anyOf": [PAIRS_SCHEMA, NULL]}
        description += " A list of {name, value} pairs (an object of strings is taken too)."
    return {**_nullable(core), "description": description}


def _nullable(core: dict[str, Any]) -> dict[str, Any]:
    branches = core.get("anyOf")
    if isinstance(branches, list):
        return core if NULL in branches else {**core, "anyOf": [*branches, NULL]}
    if isinstance(core.get("type"), str) and "enum" not in core:
        return {**core, "type": [core["type"], "null"]}
    return {"anyOf": [core, NULL]}


def _described(uses: list[tuple[str, dict[str, Any]]]) -> str:
    """What the argument is (per operation where they differ) and which operations use it."""
    meanings: dict[str, list[str]] = {}
    for op, prop in uses:
        meanings.setdefault(prop.get("description", ""), []).append(op)
    if len(meanings) == 1:
        parts = [next(iter(meanings))]
    else:
        parts = [f"For {', '.join(ops)}: {text.rstrip('.')}." for text, ops in meanings.items()]
    required = [op for op, prop in uses if prop["_required"]]
    optional = [op for op, prop in uses if not prop["_required"]]
    if required:
        parts.append(f"Required by {', '.join(required)}.")
    if optional:
        parts.append(f"Optional for {', '.join(optional)}.")
    defaults: dict[str, list[str]] = {}
    for op, prop in uses:
        if prop.get("default") is not None:
            defaults.setdefault(json.dumps(prop["default"]), []).append(op)
    for value, ops in defaults.items():
        where = f" for {', '.join(ops)}" if len(ops) < len(uses) else ""
        parts.append(f"Default{where}: {value}.")
    return " ".join(filter(None, parts))
