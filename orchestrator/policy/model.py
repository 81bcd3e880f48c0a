"""Policies: what a session may use and do. A policy is a TOML file validated against these models
(unknown keys rejected, every number bounded: nothing is zero or unlimited). ``extends`` names a
parent whose settings the file overrides, section by section and key by key; lists replace.

Each file is validated on its own before it is merged, so an error names the file that holds it.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from orchestrator._resources import shipped_policies_dir
from orchestrator.errors import PolicyFileError
from orchestrator.policy._validation import first_problem

__all__ = ["Policy", "PolicyName", "load_policy", "shipped_policy_names"]

PolicyName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
ModuleName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
]
BuiltinName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

MIB = 1024 * 1024
# Deep enough for any real policy chain, shallow enough that a cycle is reported at once.
MAX_EXTENDS_DEPTH = 8


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourcesConfig(_Section):
    """Container limits. Sizes in MiB."""

    memory_mb: int = Field(512, ge=32, le=65536)
    cpus: float = Field(1.0, ge=0.05, le=64)
    pids: int = Field(256, ge=16, le=32768)
    nofile: int = Field(1024, ge=64, le=65536)
    fsize_mb: int = Field(256, ge=1, le=65536)
    tmp_mb: int = Field(64, ge=1, le=16384)
    workspace_mb: int = Field(256, ge=1, le=65536)
    home_mb: int = Field(32, ge=1, le=16384)
    shm_mb: int = Field(16, ge=1, le=4096)


class NetworkConfig(_Section):
    """Network access. Only ``none`` exists today; an egress allowlist may follow."""

    mode: Literal["none"] = "none"


class TimeoutsConfig(_Section):
    """Durations in seconds."""

    command_s: float = Field(30.0, ge=0.1, le=3600)
    max_command_s: float = Field(300.0, ge=0.1, le=86400)
    kill_grace_s: float = Field(2.0, ge=0.05, le=60)
    idle_s: float = Field(600.0, ge=1, le=7 * 86400)
    # What happens to a session idle for idle_s: removed, or frozen until its next call.
    idle_action: Literal["destroy", "pause"] = "destroy"
    # Whether a running background process or a listening port keeps a session from being idle.
    idle_counts_processes: bool = True
    max_lifetime_s: float = Field(4 * 3600.0, ge=1, le=30 * 86400)
    # A container with no orchestrator attached for this long ends itself (the backstop for an
    # orchestrator that is killed and never started again); a restart re-adopts within it.
    orphan_grace_s: float = Field(300.0, ge=2, le=7 * 86400)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.command_s > self.max_command_s:
            raise ValueError("command_s must not exceed max_command_s")
        if self.idle_s > self.max_lifetime_s:
            raise ValueError("idle_s must not exceed max_lifetime_s")
        return self


class OutputConfig(_Section):
    """Caps on what comes back from a sandbox, per stream and per reply."""

    max_stream_bytes: int = Field(100_000, ge=1024, le=64 * MIB)
    max_reply_bytes: int = Field(4 * MIB, ge=64 * 1024, le=256 * MIB)

    @model_validator(mode="after")
    def _stream_fits_reply(self) -> Self:
        if 2 * self.max_stream_bytes > self.max_reply_bytes:
            raise ValueError("max_reply_bytes must hold both streams (2 * max_stream_bytes)")
        return self


class PythonConfig(_Section):
    """The REPL. ``restricted`` enforces the module and builtin rules; ``unrestricted`` skips them
    (the container stays exactly as hardened)."""

    mode: Literal["restricted", "unrestricted"] = "restricted"
    allowed_modules: tuple[ModuleName, ...] = ()
    forbidden_modules: tuple[ModuleName, ...] = ()
    forbidden_builtins: tuple[BuiltinName, ...] = ()
    max_code_bytes: int = Field(100_000, ge=1, le=16 * MIB)
    max_history: int = Field(100, ge=1, le=100_000)


class ShellConfig(_Section):
    """Terminals, the persistent shell and background processes. Patterns are Python regexes
    searched in the whole command line."""

    enabled: bool = True
    deny_patterns: tuple[str, ...] = ()
    allow_commands: tuple[str, ...] | None = None
    dangerous_patterns: tuple[str, ...] = ()
    require_confirm_dangerous: bool = True

    @field_validator("deny_patterns", "dangerous_patterns")
    @classmethod
    def _compiles(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
        return patterns


class LimitsConfig(_Section):
    """Counts and sizes per owner and per session."""

    max_sessions_per_owner: int = Field(10, ge=1, le=10_000)
    terminals_per_session: int = Field(8, ge=1, le=256)
    processes_per_session: int = Field(8, ge=1, le=256)
    max_file_bytes: int = Field(10 * MIB, ge=1, le=1024 * MIB)


class Policy(_Section):
    """An effective policy: every setting a session runs under."""

    name: PolicyName
    description: str = ""
    extends: PolicyName | None = None
    runtime: Literal["runc", "runsc"] | None = None
    resources: ResourcesConfig = ResourcesConfig()
    network: NetworkConfig = NetworkConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    output: OutputConfig = OutputConfig()
    python: PythonConfig = PythonConfig()
    shell: ShellConfig = ShellConfig()
    limits: LimitsConfig = LimitsConfig()

    @property
    def hash(self) -> str:
        """sha256 of the effective settings; goes on container labels and into the audit log."""
        data = self.model_dump(mode="json", exclude={"extends", "description"})
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def shipped_policy_names() -> list[str]:
    return sorted(path.stem for path in shipped_policies_dir().glob("*.toml"))


def load_policy(ref: str | Path, *, search_dirs: Sequence[Path] = ()) -> Policy:
    """Load a policy by name (looked up in ``search_dirs``, then the shipped ones) or by path."""
    path = _locate(ref, search_dirs)
    merged = _load_chain(path, [*search_dirs, shipped_policies_dir()], seen=[])
    merged["extends"] = None
    return _validate(merged, file=str(path))


def _locate(ref: str | Path, search_dirs: Sequence[Path]) -> Path:
    text = str(ref)
    if isinstance(ref, Path) or "/" in text or text.endswith(".toml"):
        return Path(ref)
    for directory in [*search_dirs, shipped_policies_dir()]:
        candidate = directory / f"{text}.toml"
        if candidate.is_file():
            return candidate
    known = ", ".join(shipped_policy_names())
    raise PolicyFileError(text, "name", f"no policy of this name (shipped: {known})")


def _load_chain(path: Path, dirs: list[Path], *, seen: list[Path]) -> dict[str, Any]:
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(p.name for p in [*seen, resolved])
        raise PolicyFileError(str(path), "extends", f"cycle: {chain}")
    if len(seen) >= MAX_EXTENDS_DEPTH:
        raise PolicyFileError(str(path), "extends", f"deeper than {MAX_EXTENDS_DEPTH} levels")
    raw = _read_toml(path)
    raw.setdefault("name", path.stem)
    _validate(raw, file=str(path))
    parent_name = raw.get("extends")
    if parent_name is None:
        return raw
    parent_path = _locate(parent_name, [path.parent, *dirs])
    parent = _load_chain(parent_path, dirs, seen=[*seen, resolved])
    return _merge(parent, raw)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise PolicyFileError(str(path), "-", "file not found") from None
    except OSError as exc:
        raise PolicyFileError(str(path), "-", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyFileError(str(path), "-", f"not valid TOML: {exc}") from None


def _merge(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    merged = dict(parent)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _validate(raw: dict[str, Any], *, file: str) -> Policy:
    try:
        return Policy.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise PolicyFileError(file, *first_problem(exc)) from None
