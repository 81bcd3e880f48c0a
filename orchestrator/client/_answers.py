"""How long a client of ``sandhold serve`` waits for an answer, and what it makes of one.

A call may itself wait (a cell, a command, a ``wait`` on a process) up to the ``timeout_s`` it
names, so the wait for its answer grows with it; every wait is bounded, the longest by the cap
the policy model puts on any call's timeout. What the server answers is read as the tool
contract (a JSON object with ``success``); what is not, and a server that cannot be reached,
become structured failures with a stable ``error_type``, so every client reports them as the
refusals they stand for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "ANSWER_MARGIN",
    "ANSWER_TIMEOUT",
    "CONNECT_TIMEOUT",
    "MAX_ANSWER_BYTES",
    "MAX_TIMEOUT_S",
    "answer_timeout",
    "failure",
    "tool_result",
]

# Reaching a server and sending a request take at most this long on any network a person would
# point a client at; the answer has a wait of its own (``answer_timeout``).
CONNECT_TIMEOUT: Final = 10.0
# What the server needs beyond a call's own timeout to answer it: interrupting a cell that ran
# over (SIGINT, then the policy's kill grace and a fresh interpreter) and sending the reply.
ANSWER_MARGIN: Final = 30.0
# The longest silence to wait through when a call names no timeout_s: the default policy's
# longest command (``timeouts.max_command_s = 300``) and the margin.
ANSWER_TIMEOUT: Final = 300.0 + ANSWER_MARGIN
# The policy model refuses a max_command_s beyond a day, so no call can need a longer wait; a
# timeout_s beyond it is refused by the server, not waited for.
MAX_TIMEOUT_S: Final = 86_400.0
# The server caps what one answer carries (the policies' output caps) well below this; a client
# refuses to hold more.
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024


def answer_timeout(arguments: object) -> float:
    """How long to wait through silence for the answer to a call with these tool arguments,
    which may itself wait their ``timeout_s``."""
    given = arguments.get("timeout_s") if isinstance(arguments, Mapping) else None
    if isinstance(given, int | float) and not isinstance(given, bool) and given > 0:
        return max(ANSWER_TIMEOUT, min(float(given), MAX_TIMEOUT_S) + ANSWER_MARGIN)
    return ANSWER_TIMEOUT


def failure(arguments: object, error_type: str, message: str) -> dict[str, Any]:
    """The tool contract's failed result for a call with these arguments, made by the client
    (``backend_unavailable`` when the server cannot be reached, ``internal`` when its answer is
    not the contract)."""
    operation = arguments.get("operation") if isinstance(arguments, Mapping) else None
    return {
        "success": False,
        "operation": operation if isinstance(operation, str) else None,
        "error_type": error_type,
        "error_message": message,
    }


def tool_result(value: object) -> dict[str, Any] | None:
    """``value`` when it is a tool result (a JSON object with ``success``), else None."""
    return value if isinstance(value, dict) and "success" in value else None
