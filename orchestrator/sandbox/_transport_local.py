"""The in-process transport: ``Orchestrator.call``, the path every interface takes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.sandbox._transport import Listener

if TYPE_CHECKING:
    from orchestrator._api import Orchestrator

__all__ = ["LocalTransport"]


class LocalTransport:
    """Calls on ``orchestrator`` (entered by its owner, who closes it) for ``tenant``."""

    def __init__(self, orchestrator: Orchestrator, *, tenant: str | None = None) -> None:
        self.orchestrator = orchestrator
        self.tenant = tenant

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        on_stdout: Listener | None = None,
        on_stderr: Listener | None = None,
    ) -> dict[str, Any]:
        result = await self.orchestrator.call(
            tool, arguments, tenant=self.tenant, on_stdout=on_stdout, on_stderr=on_stderr
        )
        return result.structured

    async def aclose(self) -> None:
        return None
