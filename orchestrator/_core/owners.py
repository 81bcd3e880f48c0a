"""Owners: a tenant and, optionally, a task within it (seed 002's user + task).

Every call runs for one owner. The tenant comes from the interface (API key, or the local tenant);
the task scope is ambient for the duration of a call (``task_scope``), so that every lookup on the
way down, and every re-check after an await, sees the same owner without threading it through each
signature. Rules:

- A caller with a task sees only the sessions of that task; a caller without one (the tenant
  itself, as ops and the CLI are) sees every session of the tenant.
- A terminal's owner task may ``share`` listed actions on it with another task of the same tenant.
  Grants are not transitive: only the owner shares, and a grantee never re-shares.
- ``close_owner`` seals a task: its grants go, calls in flight for it fail at their next check,
  and what it owned is ended.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import InvalidArgumentError

SHARE_ACTIONS = frozenset({"read", "wait", "write", "interrupt", "kill"})
MAX_SEALED = 100_000
_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")

_current_task: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sandhold_task", default=None
)


def check_task(task: Any, name: str = "task") -> str | None:
    if task is None:
        return None
    if not isinstance(task, str) or not _TASK_NAME.fullmatch(task):
        raise InvalidArgumentError(
            f"{name} must be 1 to 128 characters: letters, digits and _ . : @ - "
            "(starting with a letter or digit)"
        )
    return task


def current_task() -> str | None:
    """The task the running call acts for; None for the tenant itself."""
    return _current_task.get()


@contextlib.contextmanager
def task_scope(task: str | None) -> Iterator[None]:
    """Run the enclosed calls as ``task`` (None: as the tenant)."""
    token = _current_task.set(check_task(task))
    try:
        yield
    finally:
        _current_task.reset(token)


def may_see(owner_task: str | None, caller_task: str | None) -> bool:
    """Whether a caller of the owner's tenant sees what ``owner_task`` owns."""
    return caller_task is None or caller_task == owner_task


@dataclass
class Grants:
    """Actions on terminals shared with other tasks: (tenant, grantee) -> terminal -> actions."""

    _by_grantee: dict[tuple[str, str], dict[str, frozenset[str]]] = field(default_factory=dict)
    # (tenant, task) pairs closed by close_owner: no new work for them in this process's life.
    # A dict for its order: past MAX_SEALED the oldest seal is forgotten (task names are the
    # client's to choose, so the set must not grow without bound).
    _sealed: dict[tuple[str, str], None] = field(default_factory=dict)

    def grant(self, tenant: str, grantee: str, terminal_id: str, actions: frozenset[str]) -> None:
        self._by_grantee.setdefault((tenant, grantee), {})[terminal_id] = actions

    def allows(self, tenant: str, task: str | None, terminal_id: str, action: str) -> bool:
        if task is None:
            return False
        return action in self._by_grantee.get((tenant, task), {}).get(terminal_id, frozenset())

    def forget_terminals(self, terminal_ids: set[str]) -> None:
        for grants in self._by_grantee.values():
            for terminal_id in terminal_ids & grants.keys():
                del grants[terminal_id]

    def seal(self, tenant: str, task: str) -> None:
        self._sealed[(tenant, task)] = None
        while len(self._sealed) > MAX_SEALED:
            del self._sealed[next(iter(self._sealed))]
        self._by_grantee.pop((tenant, task), None)

    def sealed(self, tenant: str, task: str | None) -> bool:
        return task is not None and (tenant, task) in self._sealed
