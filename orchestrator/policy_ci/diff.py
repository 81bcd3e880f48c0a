"""``sandhold policy diff``: what a change to a policy lets through that it stopped before, and what
it now stops, riskiest first, so a reviewer sees the cost of a change at a glance.

Modules are compared by what may actually be imported (allowlist and denylist together), not by
list membership alone; a list change with no effect is still reported, as low risk."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.worker.modpolicy import ModulePolicy

if TYPE_CHECKING:  # types only: `sandhold --help` reads ``Risk`` without building the model
    from pydantic import BaseModel

    from orchestrator.policy.model import Policy

__all__ = ["CRITICAL_MODULES", "HIGH_RISK_MODULES", "RISK_ORDER", "Change", "Risk", "diff"]

Risk = Literal["critical", "high", "medium", "low"]
Direction = Literal["loosened", "tightened", "changed"]
RISK_ORDER: dict[Risk, int] = {"critical": 0, "high": 1, "medium": 2, "low": 3}
_DIRECTION_ORDER: dict[Direction, int] = {"loosened": 0, "changed": 1, "tightened": 2}

# Modules that reach the process, the files, the network or the interpreter's internals: any one
# of them imported is an escape from the restricted REPL into the container.
# fmt: off
CRITICAL_MODULES = frozenset({
    "os", "sys", "subprocess", "socket", "ctypes", "importlib", "builtins", "inspect", "gc",
    "posix", "pty", "_thread", "_posixsubprocess", "marshal", "pickle", "code", "codeop",
    "multiprocessing", "signal", "io", "shutil",
})
HIGH_RISK_MODULES = frozenset({
    "pathlib", "glob", "fnmatch", "threading", "weakref", "http", "urllib", "requests", "ftplib",
    "smtplib", "telnetlib", "xmlrpc", "webbrowser", "shelve", "compileall", "py_compile",
    "zipimport", "pkgutil", "pdb", "profile", "cProfile", "trace", "tracemalloc", "sqlite3", "dbm",
    "resource", "asyncio", "select", "selectors", "mmap", "tempfile",
})
# Builtins that evaluate strings, reach frames or namespaces, or open files.
CRITICAL_BUILTINS = frozenset({
    "__import__", "exec", "eval", "compile", "globals", "locals", "vars", "getattr", "setattr",
    "delattr", "open", "breakpoint",
})
# fmt: on
# A limit raised by this factor or more is worth more than a glance.
LARGE_FACTOR = 4


@dataclass(frozen=True)
class Change:
    key: str
    direction: Direction
    risk: Risk
    old: str
    new: str
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def diff(old: Policy, new: Policy) -> list[Change]:
    """Every difference in effect between two policies: loosened first, riskiest first."""
    changes = [
        *_modes(old, new),
        *_modules(old, new),
        *_builtins(old, new),
        *_shell(old, new),
        *_limits(old, new),
    ]
    return sorted(changes, key=lambda c: (_DIRECTION_ORDER[c.direction], RISK_ORDER[c.risk]))


def _modes(old: Policy, new: Policy) -> Iterator[Change]:
    if old.python.mode != new.python.mode:
        loosened = new.python.mode == "unrestricted"
        yield Change(
            "python.mode",
            "loosened" if loosened else "tightened",
            "critical",
            old.python.mode,
            new.python.mode,
            "the REPL runs any Python: every module and builtin rule is off"
            if loosened
            else "the REPL's module and builtin rules apply again",
        )
    # Compared as data: "none" is the only mode today, and an allowlist mode is expected.
    before_net, after_net = old.network.model_dump(), new.network.model_dump()
    if before_net != after_net:
        direction: Direction = "loosened" if before_net.get("mode") == "none" else "changed"
        was, now = str(before_net.get("mode")), str(after_net.get("mode"))
        yield Change("network", direction, "critical", was, now, f"network {was} -> {now}")
    if old.runtime != new.runtime:
        direction = "loosened" if old.runtime == "runsc" else "tightened"
        before, after = old.runtime or "engine default", new.runtime or "engine default"
        yield Change("runtime", direction, "high", before, after, f"runtime {before} -> {after}")
    if old.shell.enabled != new.shell.enabled:
        direction = "loosened" if new.shell.enabled else "tightened"
        summary = "shells, terminals and processes " + (
            "enabled" if new.shell.enabled else "disabled"
        )
        yield Change(
            "shell.enabled",
            direction,
            "high",
            str(old.shell.enabled),
            str(new.shell.enabled),
            summary,
        )


def _module_policy(policy: Policy) -> ModulePolicy:
    python = policy.python
    return ModulePolicy(frozenset(python.allowed_modules), frozenset(python.forbidden_modules))


def _modules(old: Policy, new: Policy) -> Iterator[Change]:
    before, after = _module_policy(old), _module_policy(new)
    names = sorted(
        {*old.python.allowed_modules, *old.python.forbidden_modules}
        | {*new.python.allowed_modules, *new.python.forbidden_modules}
    )
    for name in names:
        was, now = before.refusal(name) is None, after.refusal(name) is None
        if was != now:
            risk = _module_risk(name) if now else "medium"
            yield Change(
                "python.modules",
                "loosened" if now else "tightened",
                risk,
                "importable" if was else "blocked",
                "importable" if now else "blocked",
                f"import of {name!r} " + ("now allowed" if now else "now blocked"),
            )
    lost = set(old.python.forbidden_modules) - set(new.python.forbidden_modules)
    for name in sorted(lost):
        if after.refusal(name) is not None:  # still blocked: only a layer of defence is gone
            summary = f"{name!r} no longer forbidden (still not in the allowed modules)"
            yield Change("python.forbidden_modules", "loosened", "low", name, "-", summary)


def _module_risk(name: str) -> Risk:
    top = name.split(".")[0]
    if top in CRITICAL_MODULES:
        return "critical"
    return "high" if top in HIGH_RISK_MODULES else "medium"


def _builtins(old: Policy, new: Policy) -> Iterator[Change]:
    before, after = set(old.python.forbidden_builtins), set(new.python.forbidden_builtins)
    for name in sorted(before - after):
        risk: Risk = "critical" if name in CRITICAL_BUILTINS else "medium"
        summary = f"builtin {name!r} now available"
        yield Change("python.forbidden_builtins", "loosened", risk, name, "-", summary)
    for name in sorted(after - before):
        summary = f"builtin {name!r} now forbidden"
        yield Change("python.forbidden_builtins", "tightened", "low", "-", name, summary)


def _shell(old: Policy, new: Policy) -> Iterator[Change]:
    o, n = old.shell, new.shell
    yield from _patterns("shell.deny_patterns", o.deny_patterns, n.deny_patterns, "high", "refused")
    yield from _patterns(
        "shell.dangerous_patterns",
        o.dangerous_patterns,
        n.dangerous_patterns,
        "medium",
        "in need of confirmation",
    )
    if o.require_confirm_dangerous != n.require_confirm_dangerous:
        loosened = not n.require_confirm_dangerous
        summary = (
            "dangerous commands run " + ("without" if loosened else "only with") + " confirmation"
        )
        yield Change(
            "shell.require_confirm_dangerous",
            "loosened" if loosened else "tightened",
            "medium",
            str(o.require_confirm_dangerous),
            str(n.require_confirm_dangerous),
            summary,
        )
    yield from _allow_list(o.allow_commands, n.allow_commands)


def _patterns(
    key: str, old: Iterable[str], new: Iterable[str], risk: Risk, meaning: str
) -> Iterator[Change]:
    before, after = list(old), list(new)
    for pattern in before:
        if pattern not in after:
            summary = f"commands matching {pattern!r} no longer {meaning}"
            yield Change(key, "loosened", risk, pattern, "-", summary)
    for pattern in after:
        if pattern not in before:
            summary = f"commands matching {pattern!r} now {meaning}"
            yield Change(key, "tightened", "low", "-", pattern, summary)


def _allow_list(old: tuple[str, ...] | None, new: tuple[str, ...] | None) -> Iterator[Change]:
    key = "shell.allow_commands"
    if old is None and new is not None:
        yield Change(key, "tightened", "medium", "any", ", ".join(new), "only listed programs run")
    elif old is not None and new is None:
        yield Change(key, "loosened", "high", ", ".join(old), "any", "any program runs")
    elif old is not None and new is not None:
        for program in sorted(set(new) - set(old)):
            yield Change(key, "loosened", "medium", "-", program, f"{program!r} may now run")
        for program in sorted(set(old) - set(new)):
            yield Change(key, "tightened", "low", program, "-", f"{program!r} may no longer run")


_LIMIT_SECTIONS = ("resources", "timeouts", "output", "limits")


def _limits(old: Policy, new: Policy) -> Iterator[Change]:
    pairs: list[tuple[str, BaseModel, BaseModel]] = [
        (name, getattr(old, name), getattr(new, name)) for name in _LIMIT_SECTIONS
    ]
    pairs.append(("python", old.python, new.python))
    for section, before, after in pairs:
        for field, value in before.model_dump().items():
            other = after.model_dump()[field]
            if isinstance(value, bool) or not isinstance(value, int | float) or value == other:
                continue
            raised = other > value
            large = max(value, other) >= LARGE_FACTOR * min(value, other)
            risk: Risk = "medium" if raised and large else "low"
            yield Change(
                f"{section}.{field}",
                "loosened" if raised else "tightened",
                risk,
                _number(value),
                _number(other),
                f"{'raised' if raised else 'lowered'} {_number(value)} -> {_number(other)}",
            )


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"
