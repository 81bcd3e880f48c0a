"""Paths given by callers, confined to the session's /workspace.

This is the lexical half of the rule (absolute paths elsewhere, ``..`` escapes, NUL bytes); the
other half, symlinks that point out, can only be judged inside the container, where the link
lives, and is checked there by the in-container file helper.
"""

from __future__ import annotations

import posixpath
from typing import Any

from orchestrator.backend.base import WORKSPACE
from orchestrator.errors import InvalidArgumentError

__all__ = ["MAX_PATH_CHARS", "workspace_path"]

MAX_PATH_CHARS = 4096


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
