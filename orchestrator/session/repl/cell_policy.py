"""What a cell may ask of its session's policy, decided before it runs: its code (a non-empty
string), its timeout (the policy's ``command_s`` without one, never past ``max_command_s``) and
the env it runs with (the policy's env rules, ``policy.env``).

``Repl.execute`` checks every cell here, whoever calls it, as ``PersistentShell.run`` checks its
commands; the manager checks a cell here too before it takes the session's turn (or makes a
session for it), so a bad argument is refused at once rather than after a wait. Checking a
checked cell again gives the same cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.policy.arguments import check_code, check_timeout
from orchestrator.policy.env import check_env
from orchestrator.policy.model import Policy

__all__ = ["CellRequest", "check_cell"]


@dataclass(frozen=True)
class CellRequest:
    code: str
    # Seconds the cell may run before it is interrupted.
    timeout: float
    # Variables for this cell only, over the session's.
    env: Mapping[str, str]


def check_cell(policy: Policy, code: Any, timeout: Any = None, env: Any = None) -> CellRequest:
    """The cell as ``policy`` allows it, or ``invalid_argument`` / ``policy_violation``
    saying why not."""
    check_code(code)
    return CellRequest(code, check_timeout(timeout, policy), check_env(env, policy))
