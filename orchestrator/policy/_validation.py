"""How a file's validation error reads: the first problem's key and reason, and how many more."""

from __future__ import annotations

import pydantic


def first_problem(exc: pydantic.ValidationError) -> tuple[str, str]:
    """``(dotted key, reason)`` of the first problem, the reason saying how many others follow."""
    problems = exc.errors()
    first = problems[0]
    key = ".".join(str(part) for part in first["loc"]) or "-"
    reason = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        reason = "unknown key"
    if len(problems) > 1:
        reason += f" (and {len(problems) - 1} more)"
    return key, reason
