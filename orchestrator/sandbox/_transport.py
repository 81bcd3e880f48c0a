"""How a sandbox reaches sandhold: one tool call in, its structured result out. Two
implementations, the same contract: ``LocalTransport`` (an ``Orchestrator`` in this process)
and ``RemoteTransport`` (a ``sandhold serve`` over REST). Neither raises for a refused call:
the caller reads ``success`` and ``error_type`` (``_failures.check``), as every interface does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Listener", "Transport"]

Listener = Callable[[str], None]


class Transport(Protocol):
    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        on_stdout: Listener | None = None,
        on_stderr: Listener | None = None,
    ) -> dict[str, Any]:
        """The structured result of one call; the listeners get a cell's output as it comes."""
        ...

    async def aclose(self) -> None:
        """Release what the transport holds (a connection pool); never ends a session."""
        ...
