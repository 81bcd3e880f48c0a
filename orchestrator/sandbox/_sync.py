"""``Sandbox``: ``AsyncSandbox`` for code without an event loop, driven through a blocking portal
(anyio's: an event loop in a thread of its own). One implementation: every method here runs the
async one in the portal and waits for it.

A local sandbox runs in its ``SyncOrchestrator``'s portal (the orchestrator's table belongs to
that loop); a remote one starts a portal of its own, closed when the sandbox is. Streaming
listeners are called in the portal's thread.
"""

from __future__ import annotations

import builtins
import functools
import inspect
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from anyio.from_thread import BlockingPortal, start_blocking_portal

from orchestrator.sandbox._calls import AsyncPart
from orchestrator.sandbox._results import (
    CodeContext,
    Execution,
    HistoryItem,
    Interruption,
    SandboxInfo,
    SandboxMetrics,
    SnapshotInfo,
    Variable,
)
from orchestrator.sandbox._sandbox import AsyncSandbox
from orchestrator.sandbox._transport import Listener

if TYPE_CHECKING:
    from orchestrator.sync import SyncOrchestrator

__all__ = ["Blocking", "Sandbox"]


class Blocking:
    """A part of a sandbox (``commands``, ``files``, a ``CommandHandle``...) with each of its
    coroutine methods run through ``portal``; its other attributes as they are."""

    def __init__(self, portal: BlockingPortal, part: AsyncPart) -> None:
        self._portal = portal
        self._part = part

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._part, name)
        if not inspect.iscoroutinefunction(value):
            return value

        @functools.wraps(value)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            answer = self._portal.call(functools.partial(value, *args, **kwargs))
            return Blocking(self._portal, answer) if isinstance(answer, AsyncPart) else answer

        return blocking


def _portal(orchestrator: SyncOrchestrator | None) -> tuple[BlockingPortal, ExitStack]:
    stack = ExitStack()
    if orchestrator is not None:
        return orchestrator.portal, stack
    return stack.enter_context(start_blocking_portal()), stack


class Sandbox:
    """One session, blocking: ``with Sandbox.create(orchestrator=sandhold) as sandbox: ...``."""

    def __init__(self, portal: BlockingPortal, sandbox: AsyncSandbox, stack: ExitStack) -> None:
        self._portal = portal
        self._sandbox = sandbox
        self._stack = stack
        self.sandbox_id = sandbox.sandbox_id
        self.commands = Blocking(portal, sandbox.commands)
        self.terminals = Blocking(portal, sandbox.terminals)
        self.processes = Blocking(portal, sandbox.processes)
        self.files = Blocking(portal, sandbox.files)

    @classmethod
    def _opened(
        cls, orchestrator: SyncOrchestrator | None, open_: Callable[..., Any], **arguments: Any
    ) -> Sandbox:
        portal, stack = _portal(orchestrator)
        local = orchestrator.orchestrator if orchestrator is not None else None

        async def opened() -> AsyncSandbox:
            sandbox: AsyncSandbox = await open_(orchestrator=local, **arguments)
            return sandbox

        with stack:
            sandbox = portal.call(opened)
            return cls(portal, sandbox, stack.pop_all())

    @classmethod
    def create(cls, *, orchestrator: SyncOrchestrator | None = None, **options: Any) -> Sandbox:
        """A new session; the options are ``AsyncSandbox.create``'s (policy, env, metadata,
        timeout, keep, tenant, url, api_key, task). Leaving ``with`` destroys it unless ``keep``."""
        return cls._opened(orchestrator, AsyncSandbox.create, **options)

    @classmethod
    def connect(
        cls, sandbox_id: str, *, orchestrator: SyncOrchestrator | None = None, **options: Any
    ) -> Sandbox:
        """An existing session of the caller (kept on leaving unless ``keep=False``)."""
        opening = functools.partial(AsyncSandbox.connect, sandbox_id)
        return cls._opened(orchestrator, opening, **options)

    @staticmethod
    def list(
        *, orchestrator: SyncOrchestrator | None = None, **options: Any
    ) -> builtins.list[SandboxInfo]:
        portal, stack = _portal(orchestrator)
        local = orchestrator.orchestrator if orchestrator is not None else None
        with stack:
            listed: builtins.list[SandboxInfo] = portal.call(
                functools.partial(AsyncSandbox.list, orchestrator=local, **options)
            )
        return listed

    @staticmethod
    def list_snapshots(
        *, orchestrator: SyncOrchestrator | None = None, **options: Any
    ) -> builtins.list[SnapshotInfo]:
        """The caller's snapshots (``AsyncSandbox.list_snapshots``)."""
        portal, stack = _portal(orchestrator)
        local = orchestrator.orchestrator if orchestrator is not None else None
        with stack:
            listed: builtins.list[SnapshotInfo] = portal.call(
                functools.partial(AsyncSandbox.list_snapshots, orchestrator=local, **options)
            )
        return listed

    @staticmethod
    def delete_snapshot(
        snapshot: SnapshotInfo | str,
        *,
        orchestrator: SyncOrchestrator | None = None,
        **options: Any,
    ) -> bool:
        """Delete one of the caller's snapshots (``AsyncSandbox.delete_snapshot``)."""
        portal, stack = _portal(orchestrator)
        local = orchestrator.orchestrator if orchestrator is not None else None
        deleting = functools.partial(
            AsyncSandbox.delete_snapshot, snapshot, orchestrator=local, **options
        )
        with stack:
            return bool(portal.call(deleting))

    def snapshot(self) -> SnapshotInfo:
        taken: SnapshotInfo = self._run(self._sandbox.snapshot)
        return taken

    def fork(self, *, keep: bool = False) -> Sandbox:
        """A copy of this session (``AsyncSandbox.fork``), in this sandbox's portal: leave the
        fork before this sandbox."""
        forked: AsyncSandbox = self._run(self._sandbox.fork, keep=keep)
        return Sandbox(self._portal, forked, ExitStack())

    @property
    def keep(self) -> bool:
        return self._sandbox.keep

    @keep.setter
    def keep(self, value: bool) -> None:
        self._sandbox.keep = value

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    def run_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        on_stdout: Listener | None = None,
        on_stderr: Listener | None = None,
        context: CodeContext | str | None = None,
    ) -> Execution:
        execution: Execution = self._run(
            self._sandbox.run_code, code, timeout=timeout, env=env,
            on_stdout=on_stdout, on_stderr=on_stderr, context=context,
        )  # fmt: skip
        return execution

    def create_code_context(
        self, *, language: str = "python", cwd: str | None = None
    ) -> CodeContext:
        made: CodeContext = self._run(self._sandbox.create_code_context, language=language, cwd=cwd)
        return made

    def list_code_contexts(self) -> builtins.list[CodeContext]:
        listed: builtins.list[CodeContext] = self._run(self._sandbox.list_code_contexts)
        return listed

    def restart_code_context(self, context: CodeContext | str) -> None:
        self._run(self._sandbox.restart_code_context, context)

    def remove_code_context(self, context: CodeContext | str) -> None:
        self._run(self._sandbox.remove_code_context, context)

    def inspect(self, name: str) -> Variable:
        variable: Variable = self._run(self._sandbox.inspect, name)
        return variable

    def variables(self) -> builtins.list[Variable]:
        variables: builtins.list[Variable] = self._run(self._sandbox.variables)
        return variables

    def history(self) -> builtins.list[HistoryItem]:
        entries: builtins.list[HistoryItem] = self._run(self._sandbox.history)
        return entries

    def interrupt(self) -> Interruption:
        """Stop the cell running in the session (from another thread than the one running
        it); see ``AsyncSandbox.interrupt``."""
        interruption: Interruption = self._run(self._sandbox.interrupt)
        return interruption

    def reset(self) -> None:
        self._run(self._sandbox.reset)

    def pause(self) -> bool:
        return bool(self._run(self._sandbox.pause))

    def resume(self) -> bool:
        return bool(self._run(self._sandbox.resume))

    @property
    def metadata(self) -> dict[str, str]:
        return self._sandbox.metadata

    def set_timeout(self, timeout: float) -> datetime:
        ends: datetime = self._run(self._sandbox.set_timeout, timeout)
        return ends

    def metrics(self) -> SandboxMetrics:
        figures: SandboxMetrics = self._run(self._sandbox.metrics)
        return figures

    def destroy(self) -> bool:
        return bool(self._run(self._sandbox.destroy))

    def close(self) -> None:
        """Leave the sandbox: destroy its session unless ``keep``; a portal of its own ends."""
        with self._stack:
            self._run(self._sandbox.aclose)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
