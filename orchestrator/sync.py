"""A blocking facade over the async ``Orchestrator`` for code without an event loop: one
implementation, driven through anyio's blocking portal (an event loop in a thread of its own).

    with SyncOrchestrator() as sandhold:
        result = sandhold.execute("1 + 1")
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from types import TracebackType
from typing import Any, Self, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from orchestrator._api import ExecuteResult, Orchestrator, OrchestratorConfig
from orchestrator.tools import ToolResult

__all__ = ["SyncOrchestrator"]

T = TypeVar("T")


class SyncOrchestrator(AbstractContextManager["SyncOrchestrator"]):
    def __init__(self, config: OrchestratorConfig | None = None) -> None:
        self.orchestrator = Orchestrator(config)
        self._stack = ExitStack()
        self._portal: BlockingPortal | None = None

    def __enter__(self) -> Self:
        with ExitStack() as stack:
            portal = stack.enter_context(start_blocking_portal())
            # Entered and exited in one task of the portal, as the orchestrator requires.
            stack.enter_context(portal.wrap_async_context_manager(self.orchestrator))
            self._portal = portal
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._portal = None
        self._stack.close()

    @property
    def portal(self) -> BlockingPortal:
        """The portal the orchestrator runs in, for what shares its event loop (``Sandbox``)."""
        if self._portal is None:
            raise RuntimeError("use SyncOrchestrator as a context manager (`with`)")
        return self._portal

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            raise RuntimeError("use SyncOrchestrator as a context manager (`with`)")
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    def call(
        self, tool: str, arguments: dict[str, Any], *, tenant: str | None = None
    ) -> ToolResult:
        result: ToolResult = self._run(self.orchestrator.call, tool, arguments, tenant=tenant)
        return result

    def execute(self, code: str, **options: Any) -> ExecuteResult:
        result: ExecuteResult = self._run(self.orchestrator.execute, code, **options)
        return result

    def destroy(self, session_id: str, *, tenant: str | None = None) -> bool:
        destroyed: bool = self._run(self.orchestrator.destroy, session_id, tenant=tenant)
        return destroyed

    def list_sessions(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        # Through the portal like every call: the table belongs to the event loop's thread.
        async def listed() -> list[dict[str, Any]]:
            return self.orchestrator.list_sessions(tenant=tenant)

        sessions: list[dict[str, Any]] = self._run(listed)
        return sessions
