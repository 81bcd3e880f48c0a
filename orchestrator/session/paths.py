"""Paths given by callers, confined to the session's /workspace.

This is the lexical half of the rule (absolute paths elsewhere, ``..`` escapes, NUL bytes); the
other half, symlinks that point out, can only be judged inside the container, where the link
lives, and is checked there by the in-container file helper.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.backend.base import WORKSPACE
from orchestrator.errors import InvalidArgumentError

__all__ = ["MAX_ENV_VALUE_CHARS", "MAX_ENV_VARS", "MAX_PATH_CHARS", "caller_env", "workspace_path"]

MAX_PATH_CHARS = 4096
MAX_ENV_VARS = 64
MAX_ENV_VALUE_CHARS = 32 * 1024
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Variables the sandbox's own plumbing sets; a caller may not replace them.
RESERVED_ENV = frozenset({"HOME", "PATH", "SANDHOLD_WORKER_CONFIG"})


def workspace_path(path: Any, *, name: str = "path") -> str:
    """The absolute, normalised path under /workspace that ``path`` names, or invalid_argument."""
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(f"{name} must be a non-empty string")
    if "\0" in path:
        raise InvalidArgumentError(f"{name} must not contain NUL bytes")
    if len(path) > MAX_PATH_CHARS:
        raise InvalidArgumentError(f"{name} is longer than {MAX_PATH_CHARS} characters")
    joined = posixpath.join(WORKSPACE, path)
    normal = posixpath.normpath(joined)
    if normal != WORKSPACE and not normal.startswith(WORKSPACE + "/"):
        raise InvalidArgumentError(f"{name} {path!r} is outside {WORKSPACE}")
    return normal


def caller_env(env: Any) -> dict[str, str]:
    """Environment variables a caller may add to an exec: named sanely, bounded, not ours."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise InvalidArgumentError("env must be an object of string values")
    if len(env) > MAX_ENV_VARS:
        raise InvalidArgumentError(f"env may hold at most {MAX_ENV_VARS} variables")
    checked: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise InvalidArgumentError(f"env name {str(key)[:64]!r} is not a variable name")
        if key in RESERVED_ENV:
            raise InvalidArgumentError(f"env may not set {key}")
        if not isinstance(value, str) or "\0" in value or len(value) > MAX_ENV_VALUE_CHARS:
            raise InvalidArgumentError(f"env value of {key} must be a string without NUL bytes")
        checked[key] = value
    return checked
