"""What a policy test case got, and whether that is what it expected. Pure: the runner
(``policy_tests``) turns tool results into an :class:`Outcome`; :func:`judge` compares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.policy_ci.cases import PolicyCase
from orchestrator.policy_ci.rules import UNNAMED, rule_matches, rules_of

__all__ = ["Outcome", "Status", "expected_text", "judge"]

Status = Literal["pass", "fail", "error", "skip"]
# Enough of an output or a message to see what went wrong, short enough for a table cell.
SHOWN_CHARS = 160


@dataclass(frozen=True)
class Outcome:
    """The essentials of a tool result: allowed or denied, and with what."""

    allowed: bool
    error_type: str | None = None
    error_message: str = ""
    rules: tuple[str, ...] = ()
    exit_code: int | None = None
    stdout: str = ""

    @classmethod
    def of(cls, result: Mapping[str, Any], *, stdout_key: str | None = None) -> Outcome:
        if not result.get("success"):
            return cls(
                allowed=False,
                error_type=str(result.get("error_type") or "internal"),
                error_message=str(result.get("error_message") or ""),
                rules=tuple(rules_of(result)),
            )
        keys = (stdout_key,) if stdout_key else ("stdout", "output", "content")
        stdout = next((result[k] for k in keys if isinstance(result.get(k), str)), "")
        exit_code = result.get("exit_code")
        return cls(
            allowed=True,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            stdout=stdout,
        )

    def describe(self) -> str:
        if not self.allowed:
            return f"denied: {self.error_type}"
        return "allowed" + (f", exit {self.exit_code}" if self.exit_code is not None else "")

    @property
    def rule(self) -> str:
        if not self.rules:
            return UNNAMED
        more = len(self.rules) - 1
        return self.rules[0] + (f" (+{more})" if more else "")


def expected_text(case: PolicyCase) -> str:
    if case.expect == "denied":
        return f"denied: {case.error_type}" + (f" @ {case.rule}" if case.rule else "")
    details = []
    if case.exit_code is not None:
        details.append(f"exit {case.exit_code}")
    if case.stdout is not None or case.stdout_contains is not None:
        details.append("stdout")
    return "allowed" + (f", {' + '.join(details)}" if details else "")


def judge(case: PolicyCase, got: Outcome) -> tuple[Status, str]:
    """``pass`` or ``fail``, and why it failed (empty when it passed)."""
    problems = (
        _denied_problems(case, got) if case.expect == "denied" else _allowed_problems(case, got)
    )
    return ("fail", "; ".join(problems)) if problems else ("pass", "")


def _allowed_problems(case: PolicyCase, got: Outcome) -> list[str]:
    if not got.allowed:
        return [f"expected allowed, got {got.error_type} ({got.rule}): {_short(got.error_message)}"]
    problems = []
    if case.exit_code is not None and got.exit_code != case.exit_code:
        problems.append(f"exit code {got.exit_code}, expected {case.exit_code}")
    if case.stdout is not None and got.stdout != case.stdout:
        problems.append(f"stdout {_clip(got.stdout)!r}, expected {_clip(case.stdout)!r}")
    if case.stdout_contains is not None and case.stdout_contains not in got.stdout:
        problems.append(f"stdout {_clip(got.stdout)!r} lacks {case.stdout_contains!r}")
    return problems


def _denied_problems(case: PolicyCase, got: Outcome) -> list[str]:
    if got.allowed:
        shown = f", exit {got.exit_code}" if got.exit_code is not None else ""
        output = f", stdout {_clip(got.stdout)!r}" if got.stdout else ""
        return [f"expected denied ({case.error_type}), but it was allowed{shown}{output}"]
    problems = []
    if got.error_type != case.error_type:
        problems.append(
            f"error_type {got.error_type}, expected {case.error_type}: " + _short(got.error_message)
        )
    if case.rule is not None and not rule_matches(case.rule, got.rules):
        problems.append(f"rule {', '.join(got.rules) or UNNAMED}, expected {case.rule}")
    if case.message_contains is not None and case.message_contains not in got.error_message:
        problems.append(f"message {_short(got.error_message)!r} lacks {case.message_contains!r}")
    return problems


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
