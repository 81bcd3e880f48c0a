"""Naming the rule behind a refusal, in one vocabulary for ``sandhold policy test`` and ``sandhold
policy explain``: ``shell.deny_patterns['...']``, ``python.forbidden_modules['os']``,
``python.rules.dunder_attribute``, ``files.workspace``, ``container``...

The names are derived from the messages the tools already return (the static validator's
violations, the runtime guards' errors, the command policy's ``policy`` errors), so a static
explanation and a real run name a refusal alike. Python rules are matched by the shape of the
message, static or run-time: ``'{0.__class__}'.format(1)`` and ``x.__class__`` are both
``python.rules.dunder_attribute``-like refusals, one found before the code ran, one while it ran.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["UNNAMED", "python_rule", "rule_matches", "rules_of"]

# A refusal the policy did not make: the code or command ran and the container stopped it (a
# read-only root, no capabilities, no network, a ulimit), or the code failed on its own.
CONTAINER = "container"
UNNAMED = "-"

_PYTHON: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), rule)
    for pattern, rule in (
        (
            r"module '(?P<name>[^']+)' is forbidden by the policy",
            "python.forbidden_modules[{name!r}]",
        ),
        (r"module '[^']+' is not in the allowed modules", "python.allowed_modules"),
        (r"module '[^']+' is not available in restricted mode", "python.rules.data_library"),
        (r"forbidden builtin (?:name )?'(?P<name>\w+)'", "python.forbidden_builtins[{name!r}]"),
        (
            r"builtin '(?P<name>\w+)' is forbidden by the policy",
            "python.forbidden_builtins[{name!r}]",
        ),
        (r"^code is \d+ bytes, more than the limit", "python.max_code_bytes"),
        (r"relative imports are not allowed", "python.rules.relative_import"),
        (r"importing private name", "python.rules.private_import"),
        (r"may not be (?:reached|set or deleted) by name", "python.rules.attribute_by_name"),
        (r"interpreter internals|objects are not available", "python.rules.internals"),
        (r"dunder method", "python.rules.dunder_method"),
        (r"dunder attribute", "python.rules.dunder_attribute"),
        (r"dunder name|(?:global|nonlocal) declaration of", "python.rules.dunder_name"),
        (r"private attribute", "python.rules.private_attribute"),
        (r"decorator '.*' is not allowed", "python.rules.decorator"),
        (r"class pattern|__match_args__", "python.rules.match_pattern"),
        (r"cannot be set or deleted|cannot be set through super", "python.rules.attribute_write"),
        (r"string annotation", "python.rules.annotation"),
        (r"str\.format is not available", "python.rules.format"),
        (r"\b(?:vars|dir)\(\)", "python.rules.introspection"),
        (r"nested deeper than", "python.rules.max_depth"),
    )
)
_SHELL_RULE = re.compile(
    r" \((?P<rule>shell\.(?:enabled|deny_patterns|allow_commands|dangerous_patterns)\b.*)\)$",
    re.DOTALL,
)
_LIMIT = re.compile(r"\b(max_sessions_per_owner|terminals_per_session|processes_per_session)\b")
_FILES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"through a symlink|is a symlink|points outside"), "files.symlinks"),
    (re.compile(r"is outside /workspace|names /workspace itself"), "files.workspace"),
    (re.compile(r"more than the limit of"), "limits.max_file_bytes"),
)
_LINE_PREFIX = re.compile(r"^(?:code rejected: )?line \d+: ")
_MORE_SUFFIX = re.compile(r" \(and \d+ more\)$")


def python_rule(message: str) -> str | None:
    """The rule a restricted-mode refusal names, from its message (static or run time)."""
    text = _MORE_SUFFIX.sub("", _LINE_PREFIX.sub("", message))
    for pattern, rule in _PYTHON:
        found = pattern.search(text)
        if found is not None:
            return rule.format(**found.groupdict())
    return None


def shell_rule(message: str) -> str | None:
    """The rule of a ``policy`` error from the command policy (its message ends ``(rule)``)."""
    found = _SHELL_RULE.search(message)
    return found["rule"] if found else None


def rules_of(result: Mapping[str, Any]) -> list[str]:
    """Every rule a failed tool result names, most telling first; empty when it succeeded."""
    if result.get("success"):
        return []
    error_type = str(result.get("error_type") or "")
    message = str(result.get("error_message") or "")
    if error_type == "policy":
        return [shell_rule(message) or "policy"]
    if error_type in ("validation", "import_blocked"):
        violations = [str(v) for v in result.get("violations") or []]
        named = _unique(python_rule(text) for text in (violations or [message]))
        return named or ["python.rules"]
    return [_other_rule(error_type, message)]


def _other_rule(error_type: str, message: str) -> str:
    if error_type == "timeout":
        return "timeouts.command_s"
    if error_type == "output_limit":
        return "output.max_reply_bytes"
    if error_type == "quota_exceeded":
        found = _LIMIT.search(message)
        return f"limits.{found[1]}" if found else "max_sessions"
    if error_type == "invalid_argument":
        for pattern, rule in _FILES:
            if pattern.search(message):
                return rule
        return "arguments"
    if error_type == "process_crashed":
        return "resources.memory_mb" if "memory" in message.lower() else CONTAINER
    if message.startswith("[Errno") or error_type in ("MemoryError", "PermissionError"):
        return CONTAINER
    return UNNAMED


def _unique(rules: Iterable[str | None]) -> list[str]:
    seen: dict[str, None] = {}
    for rule in rules:
        if rule is not None:
            seen.setdefault(rule)
    return list(seen)


def rule_matches(expected: str, rules: Iterable[str]) -> bool:
    """``expected`` names one of ``rules`` in full or as a prefix that ends at ``[`` or ``.``:
    ``shell.deny_patterns`` matches ``shell.deny_patterns['\\bdocker\\b']``."""
    return any(
        rule == expected or (rule.startswith(expected) and rule[len(expected)] in "[.")
        for rule in rules
    )
