"""Checks for caller-given arguments. A bad argument is refused here, with ``invalid_argument``,
before anything reaches a session or the engine. Each kind of argument has one checker and one
bound, used by every path that takes it (a command's is ``commands.check_command_text``)."""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

from orchestrator.errors import InvalidArgumentError
from orchestrator.policy.model import Policy

__all__ = [
    "MAX_ID_CHARS",
    "check_code",
    "check_flag",
    "check_id",
    "check_int",
    "check_max_tokens",
    "check_policy_name",
    "check_session_id",
    "check_timeout",
    "check_variable",
]

# Our ids are 32 hex characters; any string up to this is looked up (and an unknown one is not
# found), so the bound only keeps a lookup and its error message small.
MAX_ID_CHARS = 128
_POLICY_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
MAX_TOKENS_LIMIT = 1_000_000


def check_code(code: Any) -> TypeGuard[str]:
    if not isinstance(code, str) or not code.strip():
        raise InvalidArgumentError("code must be a non-empty string")
    return True


def check_id(value: Any, name: str) -> str:
    """An id (``session_id``, ``terminal_id``, ...): only the type and size are checked, since
    any such string is looked up, and an unknown one is not found."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise InvalidArgumentError(f"{name} must be a string of 1 to {MAX_ID_CHARS} characters")
    return value


def check_session_id(session_id: Any) -> TypeGuard[str]:
    check_id(session_id, "session_id")
    return True


def check_int(value: Any, name: str, low: int, high: int) -> int:
    """An integer in ``[low, high]``; a bool is not an integer here."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be an integer in [{low}, {high}]")
    return value


def check_flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be true or false")
    return value


def check_variable(name: Any) -> TypeGuard[str]:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise InvalidArgumentError("variable_name must be a Python identifier")
    return True


def check_timeout(timeout_s: Any, policy: Policy) -> float:
    """The timeout to use: the policy's default when none is given, else the caller's, bounded."""
    if timeout_s is None:
        return policy.timeouts.command_s
    limit = policy.timeouts.max_command_s
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not math.isfinite(timeout_s)
        or not 0 < timeout_s <= limit
    ):
        raise InvalidArgumentError(f"timeout_s must be a number in (0, {limit:g}]")
    return float(timeout_s)


def check_policy_name(policy: Any) -> str | None:
    """A policy *name*: callers never point the orchestrator at a file path."""
    if policy is not None and (not isinstance(policy, str) or not _POLICY_NAME.match(policy)):
        raise InvalidArgumentError("policy must be the name of a policy")
    return policy


def check_max_tokens(max_tokens: Any) -> TypeGuard[int]:
    check_int(max_tokens, "max_tokens", 1, MAX_TOKENS_LIMIT)
    return True
