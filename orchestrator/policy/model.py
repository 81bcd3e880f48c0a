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
from collections.abc import Collection, Sequence
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
from orchestrator.errors import PolicyFileError, UnknownTemplateError
from orchestrator.policy._validation import first_problem

__all__ = ["Policy", "PolicyName", "load_policy", "shipped_policy_names"]

PolicyName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
ModuleName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
]
BuiltinName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
TemplateName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,39}$")]

MIB = 1024 * 1024
# Deep enough for any real policy chain, shallow enough that a cycle is reported at once.
MAX_EXTENDS_DEPTH = 8


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImageConfig(_Section):
    """The image sessions run from."""

    template: TemplateName = Field(
        "base",
        description="The image template: `base` (Python and the worker), `python-data` (numpy, "
        "pandas, matplotlib, scipy, pillow), or one from the template directories. A name no "
        "template has is refused when the policy loads.",
    )


class ResourcesConfig(_Section):
    """Container limits. Sizes in MiB."""

    memory_mb: int = Field(
        512, ge=32, le=65536, description="Memory limit; swap is not allowed beyond it."
    )
    cpus: float = Field(1.0, ge=0.05, le=64, description="CPU time, in cores (a CFS quota).")
    pids: int = Field(
        256, ge=16, le=32768, description="Processes and threads the container may hold at once."
    )
    nofile: int = Field(
        1024, ge=64, le=65536, description="Open file descriptors per process (ulimit -n)."
    )
    fsize_mb: int = Field(
        256, ge=1, le=65536, description="Largest file a process may write (ulimit -f)."
    )
    tmp_mb: int = Field(64, ge=1, le=16384, description="Size of the /tmp tmpfs.")
    workspace_mb: int = Field(
        256, ge=1, le=65536, description="Size of the /workspace tmpfs, where files live."
    )
    home_mb: int = Field(32, ge=1, le=16384, description="Size of the sandbox user's home tmpfs.")
    shm_mb: int = Field(16, ge=1, le=4096, description="Size of /dev/shm.")


# One egress rule: a host name, or ``*.`` and a domain (its subdomains, not the domain itself),
# with an optional ``:port``. Lower case, as DNS compares names; no IP literals (names only).
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
AllowRule = Annotated[
    str,
    StringConstraints(
        pattern=rf"^(\*\.)?{_LABEL}(\.{_LABEL})+(:[1-9][0-9]{{0,4}})?$", max_length=260
    ),
]
# Enough for a real allowlist; a longer one is a sign the session wants ``open``.
MAX_ALLOW_RULES = 256


class NetworkConfig(_Section):
    """Network access. ``allowlist`` and ``open`` reach the network only through sandhold's egress
    proxy, which refuses private, loopback, link-local, multicast and metadata addresses after it
    resolves a name, in both modes."""

    mode: Literal["none", "allowlist", "open"] = Field(
        "none",
        description="`none`: the container has a loopback interface and nothing else. "
        "`allowlist`: HTTP(S) through the egress proxy to the hosts of `allow` only. "
        "`open`: HTTP(S) through the egress proxy to any public address.",
    )
    allow: list[AllowRule] = Field(
        [],
        max_length=MAX_ALLOW_RULES,
        description="With `allowlist`: hosts the session may reach, as `host`, `*.domain` "
        "(any subdomain, not the domain itself) or either with `:port`; without a port, 80 and "
        "443. Names only, lower case.",
    )
    max_connections: int = Field(
        32, ge=1, le=1024, description="Connections through the proxy a session may hold at once."
    )
    max_mb: int = Field(
        1024,
        ge=1,
        le=1024 * 1024,
        description="Bytes (MiB, both ways together) a session may move through the proxy in "
        "its life; past it, connections are closed and new ones refused.",
    )
    idle_timeout_s: float = Field(
        60.0, ge=1, le=3600, description="A proxied connection silent this long is closed."
    )
    max_connection_s: float = Field(
        900.0, ge=1, le=86400, description="Longest life of one proxied connection."
    )

    @field_validator("allow")
    @classmethod
    def _names_not_addresses(cls, rules: list[str]) -> list[str]:
        for rule in rules:
            if rule.partition(":")[0].rsplit(".", 1)[-1].isdigit():
                raise ValueError(f"{rule!r} is an address: rules name hosts")
        return rules

    @model_validator(mode="after")
    def _allow_only_with_allowlist(self) -> Self:
        if self.allow and self.mode != "allowlist":
            raise ValueError(f"allow is only for mode allowlist (mode is {self.mode})")
        return self


class TimeoutsConfig(_Section):
    """Durations in seconds."""

    command_s: float = Field(
        30.0,
        ge=0.1,
        le=3600,
        description="Timeout of a cell or shell command when the call gives none.",
    )
    max_command_s: float = Field(
        300.0, ge=0.1, le=86400, description="Longest timeout a call may ask for."
    )
    kill_grace_s: float = Field(
        2.0,
        ge=0.05,
        le=60,
        description="After an interrupt or TERM, how long before KILL follows.",
    )
    idle_s: float = Field(
        600.0,
        ge=1,
        le=7 * 86400,
        description="A session with no call for this long is idle (see idle_action).",
    )
    idle_action: Literal["destroy", "pause"] = Field(
        "destroy",
        description="What happens to an idle session: removed, or frozen until its next call.",
    )
    idle_counts_processes: bool = Field(
        True,
        description="Whether a running background process or a listening port keeps a "
        "session from being idle.",
    )
    max_lifetime_s: float = Field(
        4 * 3600.0,
        ge=1,
        le=30 * 86400,
        description="A session ends this long after it was created, busy or not.",
    )
    # The backstop for an orchestrator that is killed and never started again.
    orphan_grace_s: float = Field(
        300.0,
        ge=2,
        le=7 * 86400,
        description="A container with no orchestrator attached for this long ends itself; a "
        "restart within it re-adopts the session.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.command_s > self.max_command_s:
            raise ValueError("command_s must not exceed max_command_s")
        if self.idle_s > self.max_lifetime_s:
            raise ValueError("idle_s must not exceed max_lifetime_s")
        return self


class OutputConfig(_Section):
    """Caps on what comes back from a sandbox, per stream and per reply."""

    max_stream_bytes: int = Field(
        100_000,
        ge=1024,
        le=64 * MIB,
        description="Bytes of stdout (and of stderr) a reply carries; the rest is cut and "
        "the reply says `truncated`.",
    )
    max_reply_bytes: int = Field(
        4 * MIB,
        ge=64 * 1024,
        le=256 * MIB,
        description="Largest reply the worker may send; must hold both streams.",
    )
    max_result_bytes: int = Field(
        2 * MIB,
        ge=1024,
        le=256 * MIB,
        description="Bytes all rich results of one cell (figures, tables, `display()`) may "
        "take together, base64 counted; within what `max_reply_bytes` leaves beside both "
        "streams. A representation that does not fit is left out and its result says "
        "`truncated`.",
    )

    @model_validator(mode="after")
    def _stream_fits_reply(self) -> Self:
        if 2 * self.max_stream_bytes > self.max_reply_bytes:
            raise ValueError("max_reply_bytes must hold both streams (2 * max_stream_bytes)")
        return self


class PythonConfig(_Section):
    """The REPL. ``restricted`` enforces the module and builtin rules; ``unrestricted`` skips them
    (the container stays exactly as hardened)."""

    mode: Literal["restricted", "unrestricted"] = Field(
        "restricted",
        description="`restricted` checks every import, builtin and attribute against the lists "
        "below; `unrestricted` runs code as plain Python.",
    )
    allowed_modules: tuple[ModuleName, ...] = Field(
        (),
        description="Modules restricted code may import; a submodule only when it is listed too.",
    )
    forbidden_modules: tuple[ModuleName, ...] = Field(
        (),
        description="Modules refused even when allowed, with every submodule; checked first.",
    )
    forbidden_builtins: tuple[BuiltinName, ...] = Field(
        (), description="Builtins restricted code may not use (`eval`, `open`, ...)."
    )
    max_code_bytes: int = Field(
        100_000, ge=1, le=16 * MIB, description="Largest cell, in UTF-8 bytes."
    )
    max_history: int = Field(
        100, ge=1, le=100_000, description="Cells a session keeps in its history."
    )


class ShellConfig(_Section):
    """Terminals, the persistent shell and background processes. Patterns are Python regexes
    searched in the whole command line."""

    enabled: bool = Field(
        True, description="Whether terminals, the shell and background processes exist at all."
    )
    deny_patterns: tuple[str, ...] = Field(
        (), description="A command matching any of these regexes is refused."
    )
    allow_commands: tuple[str, ...] | None = Field(
        None,
        description="When set, the only programs a command may run (each simple command's "
        "first word, as a basename); unset: any.",
    )
    dangerous_patterns: tuple[str, ...] = Field(
        (),
        description="A command matching any of these regexes needs `confirm_dangerous: true`.",
    )
    require_confirm_dangerous: bool = Field(
        True,
        description="Whether dangerous commands need the confirmation; false lets them run.",
    )

    @field_validator("deny_patterns", "dangerous_patterns")
    @classmethod
    def _compiles(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
        return patterns


# A name pattern of ``env.deny``: a variable name in which ``*`` stands for any run of
# characters (``LD_*``); matched case-sensitively, as the programs that read them do.
EnvNamePattern = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_*]{1,256}$")]


class EnvConfig(_Section):
    """Environment variables callers give a session or one command (``env``). Names that would
    subvert the sandbox's own machinery (``SANDHOLD_*``, the dynamic loader's ``LD_*``, ``PATH``,
    ``HOME``, what bash runs at start-up) are refused under every policy; this list adds more."""

    deny: tuple[EnvNamePattern, ...] = Field(
        (
            "PYTHON*",
            "NODE_OPTIONS",
            "PERL5OPT",
            "PERL5LIB",
            "PERLLIB",
            "RUBYOPT",
            "RUBYLIB",
            "JAVA_TOOL_OPTIONS",
            "_JAVA_OPTIONS",
        ),
        description="Names a caller may not set (`*` matches any run of characters); these "
        "come on top of the names refused under every policy (see the tool contract).",
    )


class LimitsConfig(_Section):
    """Counts and sizes per owner and per session."""

    max_sessions_per_owner: int = Field(
        10, ge=1, le=10_000, description="Sessions of this policy one owner may hold at once."
    )
    terminals_per_session: int = Field(
        8, ge=1, le=256, description="Terminals a session may have running at once."
    )
    processes_per_session: int = Field(
        8, ge=1, le=256, description="Background processes a session may have running at once."
    )
    max_file_bytes: int = Field(
        10 * MIB,
        ge=1,
        le=1024 * MIB,
        description="Largest file the files tool reads, writes or moves in an archive.",
    )


class Policy(_Section):
    """An effective policy: every setting a session runs under."""

    name: PolicyName = Field(
        description="The policy's name; a file's stem when the file gives none."
    )
    description: str = Field("", description="For people: what the policy is for.")
    extends: PolicyName | None = Field(
        None, description="A parent policy whose settings this file overrides key by key."
    )
    runtime: Literal["runc", "runsc"] | None = Field(
        None,
        description="The container runtime: `runsc` is gVisor, which the engine must have "
        "registered; unset: the engine's default.",
    )
    image: ImageConfig = Field(ImageConfig(), description="The image sessions run from.")
    resources: ResourcesConfig = Field(ResourcesConfig(), description="Container limits.")
    network: NetworkConfig = Field(NetworkConfig(), description="Network access.")
    timeouts: TimeoutsConfig = Field(TimeoutsConfig(), description="Durations, in seconds.")
    output: OutputConfig = Field(OutputConfig(), description="Caps on output.")
    python: PythonConfig = Field(PythonConfig(), description="The Python REPL's rules.")
    shell: ShellConfig = Field(ShellConfig(), description="Commands and their rules.")
    limits: LimitsConfig = Field(LimitsConfig(), description="Counts and sizes.")
    env: EnvConfig = Field(EnvConfig(), description="Environment variables callers may set.")

    @property
    def hash(self) -> str:
        """sha256 of the effective settings; goes on container labels and into the audit log."""
        data = self.model_dump(mode="json", exclude={"extends", "description"})
        if self.image == ImageConfig():
            # Policies on the default image keep the hashes they had before templates existed.
            del data["image"]
        if self.network == NetworkConfig():
            data["network"] = {"mode": "none"}  # the hash it had before egress existed
        if self.env == EnvConfig():
            del data["env"]  # the default env rules: the hash it had before they existed

        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def shipped_policy_names() -> list[str]:
    return sorted(path.stem for path in shipped_policies_dir().glob("*.toml"))


def load_policy(
    ref: str | Path,
    *,
    search_dirs: Sequence[Path] = (),
    templates: Collection[str] | None = None,
) -> Policy:
    """Load a policy by name (looked up in ``search_dirs``, then the shipped ones) or by path.
    With ``templates`` (the names the orchestrator knows), a file naming any other template is
    refused, naming that file and ``image.template``."""
    path = _locate(ref, search_dirs)
    merged = _load_chain(path, [*search_dirs, shipped_policies_dir()], seen=[], templates=templates)
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


def _load_chain(
    path: Path, dirs: list[Path], *, seen: list[Path], templates: Collection[str] | None
) -> dict[str, Any]:
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(p.name for p in [*seen, resolved])
        raise PolicyFileError(str(path), "extends", f"cycle: {chain}")
    if len(seen) >= MAX_EXTENDS_DEPTH:
        raise PolicyFileError(str(path), "extends", f"deeper than {MAX_EXTENDS_DEPTH} levels")
    raw = _read_toml(path)
    raw.setdefault("name", path.stem)
    checked = _validate(raw, file=str(path))
    if templates is not None and "image" in raw and checked.image.template not in templates:
        name = checked.image.template
        raise UnknownTemplateError(name, sorted(templates), file=str(path), key="image.template")
    parent_name = raw.get("extends")
    if parent_name is None:
        return raw
    parent_path = _locate(parent_name, [path.parent, *dirs])
    parent = _load_chain(parent_path, dirs, seen=[*seen, resolved], templates=templates)
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
