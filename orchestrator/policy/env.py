"""Environment variables a caller gives a session (``env`` at creation) or one command (``env`` on
a terminal, a shell command or a background process), checked before anything reaches a session.

Two kinds of refusal, so a caller can tell a typo from a rule:

- ``invalid_argument``: not a map of strings, a name that is not ``[A-Za-z_][A-Za-z0-9_]*``, a
  NUL byte or a lone surrogate in a value, or past a size bound (``MAX_ENV_*``).
- ``policy``: a name refused under every policy (``ALWAYS_DENIED``, rule ``env.reserved``), or
  by the session's policy (``env.deny``, rule ``env.deny``).

``ALWAYS_DENIED`` holds what would subvert the sandbox's own machinery whatever the policy says:
our settings (``SANDHOLD_*``, the worker's among them); code the dynamic loader or glibc would
load into every process, the worker and our helpers included (``LD_*``, ``GCONV_PATH``); the
binaries a command resolves to and the home our tmpfs provides (``PATH``, ``HOME``); and what
bash (or sh) runs or reads before the command the shell policy approved (``BASH_ENV``, ``ENV``,
exported functions, ``SHELLOPTS``/``BASHOPTS`` with ``PS4``, ``PROMPT_COMMAND`` in the
interactive persistent shell, ``IFS``). A policy cannot lift them: a child policy's ``deny``
replaces its parent's list whole, and forgetting one must not open the shell policy.

Values are never part of an error message: they may be secrets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any, Final

from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.policy.model import Policy

__all__ = [
    "ALWAYS_DENIED",
    "MAX_ENV_NAME_CHARS",
    "MAX_ENV_TOTAL_BYTES",
    "MAX_ENV_VALUE_BYTES",
    "MAX_ENV_VARS",
    "check_env",
    "merged_env",
]

ALWAYS_DENIED: Final = (
    "SANDHOLD_*",
    "LD_*",
    "GCONV_PATH",
    "PATH",
    "HOME",
    "BASH_ENV",
    "ENV",
    "BASH_FUNC_*",
    "SHELLOPTS",
    "BASHOPTS",
    "PROMPT_COMMAND",
    "PS0",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "IFS",
)
# Far above any real configuration, far below what one exec can carry (Linux takes 128 KiB per
# string and ~2 MiB of arguments and environment together): a session's env and a command's,
# merged, stay within these too.
MAX_ENV_VARS: Final = 256
MAX_ENV_NAME_CHARS: Final = 256
MAX_ENV_VALUE_BYTES: Final = 32 * 1024
MAX_ENV_TOTAL_BYTES: Final = 256 * 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env(env: Any, policy: Policy, *, name: str = "env") -> dict[str, str]:
    """``env`` as a plain dict (empty for None), or the refusal the module doc describes."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise InvalidArgumentError(f"{name} must be an object of string values")
    if len(env) > MAX_ENV_VARS:
        raise InvalidArgumentError(f"{name} may hold at most {MAX_ENV_VARS} variables")
    checked: dict[str, str] = {}
    for key, value in env.items():
        _check_name(key, name)
        _check_value(key, value, name)
        checked[key] = value
    _check_total(checked, name)
    for key in checked:
        _check_allowed(key, policy, name)
    return checked


def merged_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """A session's env with one command's over it (both checked), within the same bounds."""
    merged = {**base, **extra}
    if len(merged) > MAX_ENV_VARS:
        raise InvalidArgumentError(
            f"env and the session's env together hold more than {MAX_ENV_VARS} variables"
        )
    _check_total(merged, "env and the session's env together")
    return merged


def _check_name(key: Any, name: str) -> None:
    if not isinstance(key, str) or len(key) > MAX_ENV_NAME_CHARS or not _NAME.fullmatch(key):
        shown = str(key)[:64] if isinstance(key, str) else type(key).__name__
        raise InvalidArgumentError(
            f"{name}: {shown!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*, at most "
            f"{MAX_ENV_NAME_CHARS} characters)"
        )


def _check_value(key: str, value: Any, name: str) -> None:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name}: the value of {key} must be a string")
    if "\0" in value:
        raise InvalidArgumentError(f"{name}: the value of {key} contains a NUL byte")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"{name}: the value of {key} is not valid Unicode (a lone surrogate)"
        ) from None
    if size > MAX_ENV_VALUE_BYTES:
        raise InvalidArgumentError(
            f"{name}: the value of {key} is longer than {MAX_ENV_VALUE_BYTES} bytes"
        )


def _check_total(env: Mapping[str, str], name: str) -> None:
    # As the kernel counts it: NAME=VALUE and its NUL.
    total = sum(len(k) + len(v.encode("utf-8")) + 2 for k, v in env.items())
    if total > MAX_ENV_TOTAL_BYTES:
        raise InvalidArgumentError(f"{name} is larger than {MAX_ENV_TOTAL_BYTES} bytes in all")


def _check_allowed(key: str, policy: Policy, name: str) -> None:
    for pattern in ALWAYS_DENIED:
        if fnmatchcase(key, pattern):
            raise PolicyViolationError(
                f"{name}: {key} may not be set under any policy (it would subvert the sandbox)",
                rule="env.reserved",
            )
    for pattern in policy.env.deny:
        if fnmatchcase(key, pattern):
            raise PolicyViolationError(
                f"{name}: policy {policy.name!r} does not let a caller set {key} ({pattern})",
                rule="env.deny",
            )
