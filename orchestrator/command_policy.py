"""The shell policy applied to a command before it runs anywhere (terminal start, shell run,
process start). Pure: the decision names the rule, so `policy` errors and `policy explain` agree.

The patterns are policy, not the boundary: a determined user can always spell a command another
way inside the container, which is why the container holds regardless.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.policy import Policy

MAX_COMMAND_CHARS = 64 * 1024


@dataclass(frozen=True)
class CommandDecision:
    allowed: bool
    rule: str
    reason: str


def check_command_text(command: Any) -> str:
    if not isinstance(command, str) or not command.strip():
        raise InvalidArgumentError("command must be a non-empty string")
    if "\0" in command:
        raise InvalidArgumentError("command must not contain NUL bytes")
    if len(command) > MAX_COMMAND_CHARS:
        raise InvalidArgumentError(f"command is longer than {MAX_COMMAND_CHARS} characters")
    return command


def decide(command: str, policy: Policy, *, confirm_dangerous: bool = False) -> CommandDecision:
    """Which rule decides ``command`` under ``policy``, and whether it may run."""
    shell = policy.shell
    if not shell.enabled:
        return CommandDecision(False, "shell.enabled", f"policy {policy.name!r} disables shells")
    for pattern in shell.deny_patterns:
        if re.search(pattern, command):
            return CommandDecision(False, f"shell.deny_patterns[{pattern!r}]", "command denied")
    if shell.allow_commands is not None:
        for program in programs(command):
            if program not in shell.allow_commands:
                reason = f"{program!r} is not in the allow list"
                return CommandDecision(False, "shell.allow_commands", reason)
    for pattern in shell.dangerous_patterns:
        if re.search(pattern, command):
            rule = f"shell.dangerous_patterns[{pattern!r}]"
            if not shell.require_confirm_dangerous or confirm_dangerous:
                return CommandDecision(True, rule, "dangerous, confirmed")
            return CommandDecision(False, rule, "dangerous: repeat with confirm_dangerous=true")
    return CommandDecision(True, "default", "no rule matched")


def enforce(command: Any, policy: Policy, *, confirm_dangerous: Any = False) -> str:
    """The checked command, or a ``policy`` / ``invalid_argument`` error naming why not."""
    text = check_command_text(command)
    if not isinstance(confirm_dangerous, bool):
        raise InvalidArgumentError("confirm_dangerous must be a boolean")
    decision = decide(text, policy, confirm_dangerous=confirm_dangerous)
    if not decision.allowed:
        raise PolicyViolationError(f"{decision.reason} ({decision.rule})", rule=decision.rule)
    return text


def programs(command: str) -> list[str]:
    """The first word of every simple command in a command line (best effort, for allow-lists)."""
    found = []
    for part in re.split(r"\|\||&&|[;|&\n]|\$\(|`", command):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            words = part.split()
        words = [w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
        if words:
            found.append(words[0].rsplit("/", 1)[-1])
    return found
