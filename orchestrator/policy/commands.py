"""The shell policy applied to a command before it runs anywhere (terminal start, shell run,
process start). Pure: the decision names the rule, so `policy` errors and `policy explain` agree.

A deny or dangerous pattern matches a command if it matches its raw text or any of its simple
commands as the words a shell would run (``shell_words``: quotes and escapes removed, so
``r''m -rf``, ``\\rm -rf`` and ``dock''er`` are ``rm -rf`` and ``docker``), words joined by one
space. An allow list checks the program of every simple command, substitutions' included.

The patterns are policy, not the boundary: they see the text, never what it becomes when it
runs (a variable's value, an alias, a script, a program that runs another, ``python -c``), so a
determined user can always spell a command another way inside the container, which is why the
container holds regardless.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.policy.arguments import check_flag
from orchestrator.policy.model import Policy
from orchestrator.policy.shell_words import simple_commands

__all__ = [
    "MAX_COMMAND_BYTES",
    "check_command_text",
    "decide",
    "enforce",
    "match_texts",
    "matches",
    "programs",
]

# The one bound on a command, on every path (terminal, shell, process, policy explain). A
# terminal's command travels as one argv element, which Linux caps at 128 KiB (MAX_ARG_STRLEN),
# so it is counted in UTF-8 bytes; 64 KiB is far more than a command line needs.
MAX_COMMAND_BYTES = 64 * 1024
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
# Words that open or join compound commands: the program is the word after them.
_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "time"}
)
# Compound commands whose following words are not a program (a variable, a list, a pattern).
_NOT_PROGRAMS = frozenset({"for", "select", "case", "esac", "in", "function", "[[", "]]"})


@dataclass(frozen=True)
class CommandDecision:
    allowed: bool
    rule: str
    reason: str


def check_command_text(command: Any) -> str:
    """The command as given, if it is one every path can run: non-blank text without NUL bytes,
    encodable as UTF-8 (no lone surrogates) in at most ``MAX_COMMAND_BYTES``."""
    if not isinstance(command, str) or not command.strip():
        raise InvalidArgumentError("command must be a non-empty string")
    if "\0" in command:
        raise InvalidArgumentError("command must not contain NUL bytes")
    too_long = f"command is longer than {MAX_COMMAND_BYTES} bytes of UTF-8"
    if len(command) > MAX_COMMAND_BYTES:  # every character is at least one byte
        raise InvalidArgumentError(too_long)
    try:
        size = len(command.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError("command is not valid Unicode text") from None
    if size > MAX_COMMAND_BYTES:
        raise InvalidArgumentError(too_long)
    return command


def match_texts(command: str) -> tuple[str, ...]:
    """What the patterns are matched against: the raw text, then each simple command."""
    return (command, *(" ".join(words) for words in simple_commands(command)))


def matches(pattern: str, texts: Sequence[str]) -> bool:
    return any(re.search(pattern, text) for text in texts)


def decide(command: str, policy: Policy, *, confirm_dangerous: bool = False) -> CommandDecision:
    """Which rule decides ``command`` under ``policy``, and whether it may run."""
    shell = policy.shell
    if not shell.enabled:
        return CommandDecision(False, "shell.enabled", f"policy {policy.name!r} disables shells")
    texts = match_texts(command)
    for pattern in shell.deny_patterns:
        if matches(pattern, texts):
            return CommandDecision(False, f"shell.deny_patterns[{pattern!r}]", "command denied")
    if shell.allow_commands is not None:
        for program in programs(command):
            if program not in shell.allow_commands:
                reason = f"{program!r} is not in the allow list"
                return CommandDecision(False, "shell.allow_commands", reason)
    for pattern in shell.dangerous_patterns:
        if matches(pattern, texts):
            rule = f"shell.dangerous_patterns[{pattern!r}]"
            if not shell.require_confirm_dangerous or confirm_dangerous:
                return CommandDecision(True, rule, "dangerous, confirmed")
            return CommandDecision(False, rule, "dangerous: repeat with confirm_dangerous=true")
    return CommandDecision(True, "default", "no rule matched")


def enforce(command: Any, policy: Policy, *, confirm_dangerous: Any = False) -> str:
    """The checked command, or a ``policy`` / ``invalid_argument`` error naming why not."""
    text = check_command_text(command)
    confirm = check_flag(confirm_dangerous, "confirm_dangerous")
    decision = decide(text, policy, confirm_dangerous=confirm)
    if not decision.allowed:
        raise PolicyViolationError(f"{decision.reason} ({decision.rule})", rule=decision.rule)
    return text


def programs(command: str) -> list[str]:
    """The program of every simple command (substitutions' included), as its basename: the
    first word that is not an assignment, a redirection (with its target) or a keyword."""
    found = []
    for words in simple_commands(command):
        program = _program(words)
        if program is not None:
            found.append(program.rsplit("/", 1)[-1])
    return found


def _program(words: list[str]) -> str | None:
    index = 0
    while index < len(words):
        word = words[index]
        if word in _NOT_PROGRAMS:
            return None
        if word[:1] in ("<", ">") or word.startswith("&>"):
            index += 2  # the operator and its target
        elif word in _KEYWORDS or _ASSIGNMENT.match(word):
            index += 1
        else:
            return word
    return None
