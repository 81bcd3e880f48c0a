"""``AsyncSandbox``: one session of sandhold as a typed handle, local or remote.

    async with AsyncSandbox.create(orchestrator=orch) as sandbox:
        execution = await sandbox.run_code("1 + 1")

``create`` makes a session (``session`` ``create``) and answers something to ``await`` (the
sandbox) or to enter (the sandbox, destroyed on leaving unless ``keep``). ``connect`` takes an
existing one (kept on leaving unless ``keep=False``). Every method is one or more tool calls
through the transport; a refused call raises its error (``_failures``), while what the code did,
an exception it raised included, is data in the answer (``Execution.error``).

Local means an ``Orchestrator`` this process has entered (``orchestrator=``); remote, a
``sandhold serve`` (``url=``/``api_key=`` or ``SANDHOLD_URL``/``SANDHOLD_API_KEY``), whose
connection pool the sandbox opens and closes itself.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Generator
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from orchestrator.errors import InvalidArgumentError, SessionNotFoundError
from orchestrator.sandbox._calls import SessionCalls
from orchestrator.sandbox._commands import AsyncCommands, AsyncProcesses, AsyncTerminals
from orchestrator.sandbox._failures import check
from orchestrator.sandbox._files import AsyncFiles
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
from orchestrator.sandbox._transport import Listener, Transport
from orchestrator.sandbox._transport_local import LocalTransport
from orchestrator.sandbox._transport_remote import RemoteTransport, remote_settings

if TYPE_CHECKING:
    from orchestrator._api import Orchestrator

__all__ = ["AsyncSandbox", "open_transport"]

REPL = "python_repl"
# Leaving a sandbox destroys its session: one call, shielded, and bounded like any teardown.
DESTROY_TIMEOUT = 30.0


def open_transport(
    orchestrator: Orchestrator | None,
    tenant: str | None,
    url: str | None,
    api_key: str | None,
    task: str | None = None,
) -> tuple[Transport, bool]:
    """The transport the arguments name, and whether the sandbox owns it (closes it)."""
    if orchestrator is not None:
        if url is not None:
            raise InvalidArgumentError("give orchestrator= or url=, not both")
        return LocalTransport(orchestrator, tenant=tenant), False
    remote = remote_settings(url, api_key)
    if remote is None:
        raise InvalidArgumentError(
            "no sandhold to use",
            hint="pass orchestrator= (an entered Orchestrator) or url= and api_key= "
            "(or set SANDHOLD_URL and SANDHOLD_API_KEY)",
        )
    return RemoteTransport(*remote, task=task), True


class AsyncSandbox:
    """One session: ``run_code``, ``commands``, ``terminals``, ``processes``, ``files``."""

    def __init__(
        self,
        transport: Transport,
        sandbox_id: str,
        *,
        owns_transport: bool = False,
        keep: bool = False,
        timeout: float | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.keep = keep
        self.timeout = timeout
        # The labels the session was created with, as sandhold keeps them.
        self.metadata: dict[str, str] = dict(metadata or {})
        self._transport = transport
        self._owns_transport = owns_transport
        self._calls = SessionCalls(transport, sandbox_id)
        self.commands = AsyncCommands(self._calls, timeout)
        self.terminals = AsyncTerminals(self._calls)
        self.processes = AsyncProcesses(self._calls)
        self.files = AsyncFiles(self._calls)

    # -- making, finding, ending ----------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        policy: str | None = None,
        env: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        timeout: float | None = None,
        keep: bool = False,
        orchestrator: Orchestrator | None = None,
        tenant: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        task: str | None = None,
        snapshot: SnapshotInfo | str | None = None,
    ) -> _Opening:
        """A new session of ``policy`` whose every process sees ``env``, labelled with
        ``metadata`` (``.metadata``, and in ``list``). ``timeout`` is the default of
        ``run_code`` and ``commands.run`` (seconds; the policy's otherwise). From a
        ``snapshot`` of the caller's: its files, policy, env and metadata (``env`` and
        ``metadata`` given update its own); its REPL starts fresh."""
        snapshot_id = snapshot.snapshot_id if isinstance(snapshot, SnapshotInfo) else snapshot

        async def made() -> AsyncSandbox:
            transport, owned = open_transport(orchestrator, tenant, url, api_key, task)
            try:
                answer = check(
                    await transport.call(
                        "session",
                        _present(
                            operation="create",
                            policy=policy,
                            env=env,
                            metadata=metadata,
                            snapshot=snapshot_id,
                        ),
                    )
                )
            except BaseException:
                await _release(transport, owned)
                raise
            return cls(
                transport, answer["session_id"], owns_transport=owned, keep=keep,
                timeout=timeout, metadata=answer.get("metadata"),
            )  # fmt: skip

        return _Opening(made)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        keep: bool = True,
        timeout: float | None = None,
        orchestrator: Orchestrator | None = None,
        tenant: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        task: str | None = None,
    ) -> _Opening:
        """The session ``sandbox_id`` of the caller (``session_not_found`` for any other);
        kept on leaving unless ``keep=False``."""

        async def found() -> AsyncSandbox:
            transport, owned = open_transport(orchestrator, tenant, url, api_key, task)
            try:
                listed = await _list(transport)
                info = next((i for i in listed if i.sandbox_id == sandbox_id), None)
                if info is None:
                    raise SessionNotFoundError(f"no session {sandbox_id!r}")
            except BaseException:
                await _release(transport, owned)
                raise
            return cls(
                transport, sandbox_id, owns_transport=owned, keep=keep, timeout=timeout,
                metadata=info.metadata,
            )  # fmt: skip

        return _Opening(found)

    @staticmethod
    async def list(
        *,
        orchestrator: Orchestrator | None = None,
        tenant: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        task: str | None = None,
    ) -> builtins.list[SandboxInfo]:
        """The caller's sessions (a remote key's tenant's, a local ``tenant``'s)."""
        transport, owned = open_transport(orchestrator, tenant, url, api_key, task)
        try:
            return await _list(transport)
        finally:
            await _release(transport, owned)

    @staticmethod
    async def list_snapshots(
        *,
        orchestrator: Orchestrator | None = None,
        tenant: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        task: str | None = None,
    ) -> builtins.list[SnapshotInfo]:
        """The caller's snapshots, oldest first."""
        transport, owned = open_transport(orchestrator, tenant, url, api_key, task)
        try:
            listed = check(await transport.call("session", {"operation": "snapshots"}))
        finally:
            await _release(transport, owned)
        return [SnapshotInfo.of(row) for row in listed.get("snapshots", [])]

    @staticmethod
    async def delete_snapshot(
        snapshot: SnapshotInfo | str,
        *,
        orchestrator: Orchestrator | None = None,
        tenant: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        task: str | None = None,
    ) -> bool:
        """Delete one of the caller's snapshots (``session_not_found`` for any other); whether
        its image is gone already (not while a session made from it runs)."""
        snapshot_id = snapshot.snapshot_id if isinstance(snapshot, SnapshotInfo) else snapshot
        transport, owned = open_transport(orchestrator, tenant, url, api_key, task)
        try:
            arguments = {"operation": "delete_snapshot", "snapshot": snapshot_id}
            answer = check(await transport.call("session", arguments))
        finally:
            await _release(transport, owned)
        return bool(answer.get("image_removed"))

    async def destroy(self) -> bool:
        """End the session and remove its container; False if it had ended already."""
        with anyio.CancelScope(shield=True), anyio.fail_after(DESTROY_TIMEOUT):
            answer = await self._transport.call(
                REPL, {"operation": "destroy", "session_id": self.sandbox_id}
            )
        if answer.get("error_type") == "session_not_found":
            return False
        return bool(check(answer).get("destroyed"))

    async def aclose(self) -> None:
        """Leave the sandbox: destroy its session unless ``keep``, release the transport."""
        try:
            if not self.keep:
                await self.destroy()
        finally:
            if self._owns_transport:
                with anyio.CancelScope(shield=True):
                    await self._transport.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- the REPL ---------------------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        on_stdout: Listener | None = None,
        on_stderr: Listener | None = None,
        context: CodeContext | str | None = None,
    ) -> Execution:
        """Run ``code`` in the session's interpreter (its state kept between calls), or in
        ``context`` (one from ``create_code_context``, or a language's name: ``"bash"``). The
        listeners get its output as it comes, before the answer; the answer holds all of it."""
        answer = await self._calls(
            REPL, "execute", code=code, env=env, context=_context_id(context),
            timeout_s=timeout if timeout is not None else self.timeout,
            on_stdout=on_stdout, on_stderr=on_stderr,
        )  # fmt: skip
        return Execution.of(answer)

    async def inspect(self, name: str) -> Variable:
        """One variable's type and value (``invalid_argument`` when there is none)."""
        info = await self._calls(REPL, "inspect", variable_name=name)
        return Variable(
            name=info["name"], type=info.get("type"), repr=info.get("repr"),
            length=info.get("length"), doc=info.get("doc"), signature=info.get("signature"),
            shape=info.get("shape"), dtype=info.get("dtype"),
        )  # fmt: skip

    async def variables(self) -> builtins.list[Variable]:
        listed = await self._calls(REPL, "list_variables")
        return [Variable(v["name"], v.get("type")) for v in listed.get("variables", [])]

    async def history(self) -> builtins.list[HistoryItem]:
        listed = await self._calls(REPL, "history")
        return [
            HistoryItem(
                index=e["index"],
                code=e["code"],
                success=e["success"],
                summary=e.get("summary", ""),
                timestamp=e.get("timestamp", ""),
                outcome=e.get("outcome", ""),
            )
            for e in listed.get("history", [])
        ]

    async def interrupt(self) -> Interruption:
        """Stop the cell running in the session now, whoever runs it (a ``run_code`` elsewhere
        whose caller gave up): SIGINT with the state kept, or after the policy's kill grace a
        fresh interpreter. Does not wait for the session's turn, as every other call does."""
        return Interruption.of(await self._calls(REPL, "interrupt"))

    async def create_code_context(
        self, *, language: str = "python", cwd: str | None = None
    ) -> CodeContext:
        """A new REPL context in the session: its own interpreter, state and cwd."""
        answer = await self._calls(REPL, "create_context", language=language, cwd=cwd)
        return CodeContext.of(answer["context"])

    async def list_code_contexts(self) -> builtins.list[CodeContext]:
        """The session's contexts, its default REPL first."""
        listed = await self._calls(REPL, "list_contexts")
        return [CodeContext.of(c) for c in listed.get("contexts", [])]

    async def restart_code_context(self, context: CodeContext | str) -> None:
        """A fresh interpreter for the context: its state gone, its cwd kept."""
        await self._calls(REPL, "restart_context", context=_context_id(context))

    async def remove_code_context(self, context: CodeContext | str) -> None:
        await self._calls(REPL, "remove_context", context=_context_id(context))

    async def reset(self) -> None:
        """Restart the interpreter: every variable and import gone, files kept."""
        await self._calls(REPL, "reset")

    # -- the session ------------------------------------------------------------------------

    async def pause(self) -> bool:
        """Freeze every process of the session (state and files kept); whether it changed."""
        return bool((await self._calls("session", "pause")).get("changed"))

    async def resume(self) -> bool:
        """Thaw it (any other call does too); whether it changed."""
        return bool((await self._calls("session", "resume")).get("changed"))

    async def set_timeout(self, timeout: float) -> datetime:
        """End the session ``timeout`` seconds from now, sooner or later than it would have;
        never past its policy's ``timeouts.max_lifetime_s`` from its start (``policy`` error
        beyond). When it ends."""
        answer = await self._calls("session", "set_timeout", timeout_s=timeout)
        return datetime.fromisoformat(answer["ends_at"])

    async def metrics(self) -> SandboxMetrics:
        """The container's CPU and memory now (one request to the engine, about a second)."""
        return SandboxMetrics.of(await self._calls("session", "metrics"))

    # -- snapshots ----------------------------------------------------------------------------

    async def snapshot(self) -> SnapshotInfo:
        """Keep the session's files, policy, env and metadata (not its REPL's memory) as a
        snapshot of the caller's, counted against its snapshot quota and kept across restarts
        of the server: ``create(snapshot=...)`` starts a session from it."""
        return SnapshotInfo.of(await self._calls("session", "snapshot"))

    async def fork(self, *, keep: bool = False) -> AsyncSandbox:
        """A new session with a copy of this one's files, policy, env and metadata (a fresh
        REPL), over this sandbox's connection: leave the fork before this sandbox."""
        answer = await self._calls("session", "fork")
        return AsyncSandbox(
            self._transport, answer["session_id"], keep=keep, timeout=self.timeout,
            metadata=answer.get("metadata"),
        )  # fmt: skip


class _Opening:
    """What ``create``/``connect`` answer: ``await`` it for the sandbox, or ``async with`` it
    to have it left (``aclose``) when the block ends."""

    def __init__(self, make: Callable[[], Awaitable[AsyncSandbox]]) -> None:
        self._make = make
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._make().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._make()
        return self._sandbox

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.aclose()


async def _list(transport: Transport) -> builtins.list[SandboxInfo]:
    listed = check(await transport.call(REPL, {"operation": "list_sessions"}))
    return [SandboxInfo.of(row) for row in listed.get("sessions", [])]


async def _release(transport: Transport, owned: bool) -> None:
    if owned:
        with anyio.CancelScope(shield=True):
            await transport.aclose()


def _context_id(context: CodeContext | str | None) -> str | None:
    return context.id if isinstance(context, CodeContext) else context


def _present(**arguments: Any) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if v is not None}
