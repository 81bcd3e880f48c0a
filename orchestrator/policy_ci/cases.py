"""Policy test cases: TOML files that say what a policy must allow and what it must stop.

A file holds ``[[case]]`` tables, and may give ``policies`` for every case that names none::

    policies = ["default", "strict"]

    [[case]]
    name = "dunder traversal to object's subclasses"
    python = "().__class__.__bases__[0].__subclasses__()"
    expect = "denied"
    error_type = "validation"
    rule = "python.rules.dunder_attribute"

    [[case]]
    name = "sudo is refused before anything runs"
    policies = ["default", "shell"]
    command = "sudo id"
    expect = "denied"
    error_type = "policy"
    rule = "shell.deny_patterns"

Each case has exactly one operation: ``python`` (python_repl execute), ``command`` (the persistent
shell's run), ``process`` (a background process, awaited), ``read`` / ``write`` + ``content``
(the files tool) or ``call`` (any tool operation: ``{tool = "files", operation = "list", path =
"/"}``; the session is filled in). ``setup`` lists shell commands run first in the same session.

``expect = "allowed"`` may add ``exit_code``, ``stdout`` (exact) and ``stdout_contains``;
``expect = "denied"`` needs ``error_type`` (an sandhold error type, or the exception a run raised,
such as ``OSError``) and may add ``rule`` (a rule name or a prefix of one, see
``policy_rules``) and ``message_contains``. Unknown keys are refused; errors name the file, the
key and the reason.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.errors import PolicyFileError
from orchestrator.policy.model import PolicyName
from orchestrator.tools import TOOLS

__all__ = ["CaseSpec", "PolicyCase", "load_case_file", "load_cases"]

OPERATIONS = ("python", "command", "process", "read", "write", "call")
OperationKind = Literal["python", "command", "process", "read", "write", "call"]
_ALLOWED_ONLY = ("exit_code", "stdout", "stdout_contains")
_DENIED_ONLY = ("error_type", "rule", "message_contains")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicyCase(_Strict):
    """One case: an operation, the policies it runs under, and what must come of it."""

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    policies: tuple[PolicyName, ...] | None = Field(None, min_length=1)
    python: str | None = None
    command: str | None = None
    process: str | None = None
    read: str | None = None
    write: str | None = None
    content: str | None = None
    call: dict[str, Any] | None = None
    setup: tuple[str, ...] = ()
    confirm_dangerous: bool = False
    timeout_s: float | None = Field(None, gt=0, le=3600)
    expect: Literal["allowed", "denied"]
    error_type: str | None = Field(None, min_length=1)
    rule: str | None = Field(None, min_length=1)
    message_contains: str | None = None
    exit_code: int | None = None
    stdout: str | None = None
    stdout_contains: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        given = [kind for kind in OPERATIONS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one operation of {', '.join(OPERATIONS)}")
        if (self.content is not None) != (self.write is not None):
            raise ValueError("write needs content, and content goes only with write")
        if self.confirm_dangerous and given[0] not in ("command", "process"):
            raise ValueError("confirm_dangerous goes only with command or process")
        if self.call is not None:
            _check_call(self.call)
        if self.expect == "denied":
            if self.error_type is None:
                raise ValueError('expect = "denied" needs error_type')
            _refuse(self, _ALLOWED_ONLY, 'expect = "allowed"')
        else:
            _refuse(self, _DENIED_ONLY, 'expect = "denied"')
        return self

    @property
    def kind(self) -> OperationKind:
        kind: OperationKind
        for kind in ("python", "command", "process", "read", "write", "call"):
            if getattr(self, kind) is not None:
                return kind
        raise AssertionError("validated: one operation is set")

    @property
    def operation_text(self) -> str:
        """The operation as a person reads it, for reports."""
        value = getattr(self, self.kind)
        if self.kind == "call":
            return " ".join(f"{key}={val!r}" for key, val in value.items())
        return str(value)


def _refuse(case: PolicyCase, keys: tuple[str, ...], needed: str) -> None:
    for key in keys:
        if getattr(case, key) is not None:
            raise ValueError(f"{key} goes only with {needed}")


def _check_call(call: dict[str, Any]) -> None:
    tool, operation = call.get("tool"), call.get("operation")
    if not isinstance(tool, str) or tool not in TOOLS:
        raise ValueError(f"call.tool must be one of {', '.join(TOOLS)}")
    if not isinstance(operation, str) or operation not in TOOLS[tool].operations:
        raise ValueError(f"call.operation must be one of {', '.join(TOOLS[tool].operations)}")


class CaseFile(_Strict):
    description: str = ""
    policies: tuple[PolicyName, ...] = ()
    case: tuple[PolicyCase, ...]

    @model_validator(mode="after")
    def _has_cases(self) -> Self:
        # Here rather than as min_length, which pydantic also reports when an item is invalid.
        if not self.case:
            raise ValueError("no [[case]] tables")
        return self


@dataclass(frozen=True)
class CaseSpec:
    """A case as loaded: where it came from and the policies it runs under."""

    file: Path
    index: int
    case: PolicyCase
    policies: tuple[str, ...]

    @property
    def suite(self) -> str:
        return self.file.stem

    @property
    def where(self) -> str:
        return f"{self.file}: case[{self.index}] {self.case.name!r}"


def load_cases(path: Path) -> list[CaseSpec]:
    """Every case of a file, or of every ``*.toml`` under a directory (sorted by path)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.toml") if p.is_file())
        if not files:
            raise PolicyFileError(str(path), "-", "no case files (*.toml) in this directory")
    elif path.is_file():
        files = [path]
    else:
        raise PolicyFileError(str(path), "-", "no such file or directory")
    return [spec for file in files for spec in load_case_file(file)]


def load_case_file(path: Path) -> list[CaseSpec]:
    parsed = _validate(_read(path), path)
    specs: list[CaseSpec] = []
    names: dict[str, int] = {}
    for index, case in enumerate(parsed.case):
        if case.name in names:
            reason = f"duplicate case name {case.name!r} (also case[{names[case.name]}])"
            raise PolicyFileError(str(path), f"case[{index}].name", reason)
        names[case.name] = index
        policies = case.policies or parsed.policies
        if not policies:
            reason = "no policies: give them in the case or at the top of the file"
            raise PolicyFileError(str(path), f"case[{index}].policies", reason)
        specs.append(CaseSpec(path, index, case, tuple(dict.fromkeys(policies))))
    return specs


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise PolicyFileError(str(path), "-", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyFileError(str(path), "-", f"not valid TOML: {exc}") from None


def _validate(raw: dict[str, Any], path: Path) -> CaseFile:
    try:
        return CaseFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        key = _key(first["loc"])
        reason = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            reason = "unknown key"
        more = len(exc.errors()) - 1
        raise PolicyFileError(
            str(path), key, reason + (f" (and {more} more)" if more else "")
        ) from None


def _key(loc: tuple[int | str, ...]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "-"
