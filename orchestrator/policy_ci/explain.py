"""``sandhold policy explain``: which rule of a policy would decide some code or a command, and why,
without running anything. The static checks are the real ones (the in-container validator and
the command policy, imported here); what only a run can tell is listed apart, never guessed."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any, Literal

from orchestrator.policy.arguments import check_code
from orchestrator.policy.commands import check_command_text, decide, match_texts, matches, programs
from orchestrator.policy.model import Policy
from orchestrator.policy_ci.rules import UNNAMED, python_rule
from orchestrator.worker.modpolicy import ModulePolicy
from orchestrator.worker.validator import Validator, Violation

__all__ = ["Explanation", "explain_code", "explain_command"]

Verdict = Literal["deny", "allow", "note"]
_FORMAT_FIELD = re.compile(r"\{[^{}]*[.\[][^{}]*\}")
_BY_NAME_CALLS = frozenset(
    {"attrgetter", "methodcaller", "getattr", "setattr", "delattr", "hasattr"}
)
# Words in a command line that meet the container rather than the command policy at run time.
_COMMAND_HINTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), note)
    for pattern, note in (
        (
            r"\b(curl|wget|nc|ncat|ssh|scp|ping|git\s+clone|pip\d?\s+install|apt(-get)?)\b|/dev/tcp/",
            "needs the network: the sandbox has none unless the policy's network section says so",
        ),
        (
            r"\b(sudo|su|doas|mount|umount|chown|setcap|unshare|nsenter|insmod|modprobe|chroot)\b",
            "needs privileges the sandbox lacks (uid 10001, no capabilities, no-new-privileges)",
        ),
        (
            r">>?\s*/(?!workspace\b|tmp\b|home/sandbox\b|dev/(null|stdout|stderr)\b)",
            "writes outside the writable mounts: the root filesystem is read-only",
        ),
        (
            r"\bpython3?\b",
            "starts an interpreter the REPL's Python rules do not apply to: only the container "
            "limits it",
        ),
    )
)


@dataclass(frozen=True)
class Finding:
    rule: str
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class Explanation:
    policy: str
    subject: Literal["code", "command"]
    decision: Literal["denied", "allowed"]
    error_type: str | None
    rule: str
    reason: str
    findings: tuple[Finding, ...] = ()
    run_time: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain_code(policy: Policy, code: Any) -> Explanation:
    """What the python_repl's static checks decide about ``code`` under ``policy``."""
    check_code(code)
    python = policy.python
    size = len(code.encode("utf-8", "surrogatepass"))
    if size > python.max_code_bytes:
        reason = f"code is {size} bytes, more than the limit of {python.max_code_bytes}"
        return _code(policy, "denied", "validation", "python.max_code_bytes", reason)
    try:
        tree = ast.parse(code, "<cell>", "exec")
    except SyntaxError as exc:
        reason = f"line {exc.lineno}: {exc.msg}"
        return _code(policy, "denied", "SyntaxError", UNNAMED, reason)
    if python.mode == "unrestricted":
        reason = "unrestricted mode: no module, builtin or attribute rules apply"
        return _code(policy, "allowed", None, "python.mode", reason, run_time=_limits(policy))
    modules = ModulePolicy(frozenset(python.allowed_modules), frozenset(python.forbidden_modules))
    violations = Validator(modules, frozenset(python.forbidden_builtins)).check(tree)
    if violations:
        return _refused(policy, violations)
    findings = tuple(_imports(tree, modules))
    run_time = (*_guard_hints(tree, modules), *_limits(policy))
    reason = "passes the static rules; the runtime guards and the container decide the rest"
    return _code(policy, "allowed", None, "python.rules", reason, findings, run_time)


def _code(
    policy: Policy,
    decision: Literal["denied", "allowed"],
    error_type: str | None,
    rule: str,
    reason: str,
    findings: tuple[Finding, ...] = (),
    run_time: tuple[str, ...] = (),
) -> Explanation:
    return Explanation(policy.name, "code", decision, error_type, rule, reason, findings, run_time)


def _refused(policy: Policy, violations: list[Violation]) -> Explanation:
    findings = tuple(
        Finding(python_rule(v.message) or "python.rules", "deny", str(v)) for v in violations
    )
    imports_only = all(v.kind == "import_blocked" for v in violations)
    error_type = "import_blocked" if imports_only else "validation"
    first = findings[0]
    more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
    return _code(policy, "denied", error_type, first.rule, first.reason + more, findings)


def _imports(tree: ast.AST, modules: ModulePolicy) -> list[Finding]:
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            if modules.refusal(name) is None:
                found.append(Finding("python.allowed_modules", "allow", f"import of {name!r}"))
    return found


def _guard_hints(tree: ast.AST, modules: ModulePolicy) -> list[str]:
    """Spots where the runtime guards, not the static rules, will decide."""
    imported = {
        alias.asname or alias.name.split(".")[0]: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    hints: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _FORMAT_FIELD.search(node.value):
                hints.setdefault(
                    "a format string reaches attributes or items: the runtime guards check each "
                    "field when it is formatted (python.rules.attribute_by_name)"
                )
        elif isinstance(node, ast.Call) and _called_name(node.func) in _BY_NAME_CALLS:
            hints.setdefault(
                f"{_called_name(node.func)}() names attributes with strings: checked at run time "
                "(python.rules.attribute_by_name)"
            )
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            hint = _module_attribute_hint(node, imported, modules)
            if hint:
                hints.setdefault(hint)
            elif node.attr.startswith("_"):
                hints.setdefault(
                    f"private attribute {node.attr!r}: allowed at run time only on classes "
                    "defined in the session (python.rules.private_attribute)"
                )
    return list(hints)


def _module_attribute_hint(
    node: ast.Attribute, imported: dict[str, str], modules: ModulePolicy
) -> str | None:
    assert isinstance(node.value, ast.Name)
    module = imported.get(node.value.id)
    if module is None:
        return None
    # A stdlib name is most likely that module re-exported (typing.sys); otherwise a submodule
    # the host has loaded is a good guess (json.decoder). Nothing is imported to find out.
    if node.attr in sys.stdlib_module_names:
        reached = node.attr
    elif f"{module}.{node.attr}" in sys.modules:
        reached = f"{module}.{node.attr}"
    else:
        return None
    refusal = modules.refusal(reached)
    if refusal is None:
        return None
    rule = python_rule(refusal) or "python.allowed_modules"
    return (
        f"{node.value.id}.{node.attr} may be the module {reached!r}: if it is, the runtime guard "
        f"refuses it with import_blocked ({rule})"
    )


def _called_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def _limits(policy: Policy) -> tuple[str, ...]:
    res, timeouts = policy.resources, policy.timeouts
    return (
        "what running it does is up to the code and the container: uid 10001 without "
        "capabilities, read-only root (writable: /workspace, /tmp, home), "
        f"network {policy.network.mode}",
        f"limits: memory {res.memory_mb} MiB, pids {res.pids}, fsize {res.fsize_mb} MiB, "
        f"/workspace {res.workspace_mb} MiB, /tmp {res.tmp_mb} MiB, "
        f"timeout {timeouts.command_s:g} s (callers may ask up to {timeouts.max_command_s:g} s)",
    )


def explain_command(
    policy: Policy, command: Any, *, confirm_dangerous: bool = False
) -> Explanation:
    """What the command policy decides about ``command`` under ``policy``, rule by rule."""
    text = check_command_text(command)
    decision = decide(text, policy, confirm_dangerous=confirm_dangerous)
    findings = tuple(_command_findings(text, policy, confirm_dangerous=confirm_dangerous))
    run_time: tuple[str, ...] = ()
    if decision.allowed:
        hints = [note for pattern, note in _COMMAND_HINTS if pattern.search(text)]
        run_time = ("exit status and output", *hints, *_limits(policy))
    return Explanation(
        policy.name,
        "command",
        "allowed" if decision.allowed else "denied",
        None if decision.allowed else "policy",
        decision.rule,
        decision.reason,
        findings,
        run_time,
    )


def _command_findings(text: str, policy: Policy, *, confirm_dangerous: bool) -> list[Finding]:
    shell = policy.shell
    if not shell.enabled:
        return [Finding("shell.enabled", "deny", "shells, terminals and processes are disabled")]
    found = [Finding("shell.enabled", "allow", "shells are enabled")]
    texts = match_texts(text)
    for pattern in shell.deny_patterns:
        if matches(pattern, texts):
            found.append(Finding(f"shell.deny_patterns[{pattern!r}]", "deny", "matches"))
    if shell.allow_commands is not None:
        for program in programs(text):
            listed = program in shell.allow_commands
            verdict: Verdict = "allow" if listed else "deny"
            reason = f"{program!r} is {'' if listed else 'not '}in the allow list"
            found.append(Finding("shell.allow_commands", verdict, reason))
    confirmed = confirm_dangerous or not shell.require_confirm_dangerous
    for pattern in shell.dangerous_patterns:
        if matches(pattern, texts):
            reason = "dangerous, confirmed" if confirmed else "dangerous: needs confirm_dangerous"
            verdict = "allow" if confirmed else "deny"
            found.append(Finding(f"shell.dangerous_patterns[{pattern!r}]", verdict, reason))
    return found
