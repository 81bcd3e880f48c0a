"""E2B's file paths and sandhold's: E2B's user works in ``/home/user``, sandhold's sessions in
``/workspace``; one is shown as the other, both ways.

A relative path starts at the home, as in E2B. A path outside the home is refused with a clear
error rather than mapped somewhere surprising: sandhold's files tool keeps every file operation
under ``/workspace``, and the E2B view keeps the same rule."""

from __future__ import annotations

import posixpath
from typing import Final

__all__ = ["HOME", "WORKSPACE", "OutsideHomeError", "to_e2b", "to_sandhold"]

HOME: Final = "/home/user"
WORKSPACE: Final = "/workspace"


class OutsideHomeError(ValueError):
    """A path that names nothing under the sandbox's home."""


def to_sandhold(path: str) -> str:
    joined = posixpath.normpath(posixpath.join(HOME, path or "."))
    for root in (HOME, WORKSPACE):
        if joined == root:
            return WORKSPACE
        if joined.startswith(root + "/"):
            return WORKSPACE + joined[len(root) :]
    raise OutsideHomeError(
        f"{path!r} is outside {HOME}: sandhold keeps a sandbox's files under its home"
    )


def to_e2b(path: str) -> str:
    if path == WORKSPACE:
        return HOME
    if path.startswith(WORKSPACE + "/"):
        return HOME + path[len(WORKSPACE) :]
    return path
