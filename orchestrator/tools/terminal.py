"""The ``terminal`` tool (seed 002's terminals) and the persistent shell's ``run``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from orchestrator.policy.commands import enforce
from orchestrator.tools._base import Fields, Operation, Tool, ToolArgs
from orchestrator.tools._env import CALL_ENV, SESSION_ENV_ON_CREATE

if TYPE_CHECKING:
    from orchestrator._core.manager import SessionManager
    from orchestrator.session.session import Session

__all__ = ["TERMINAL_TOOL"]

TERMINAL = "terminal"
TERMINAL_ID = Field(description="A terminal id from `start`.")
SESSION_ID = Field(None, description="Session to use; omit to create a new session.")
POLICY = Field(None, description="Policy for a new session (only without session_id).")
NEW_SESSION_ENV = Field(None, description=SESSION_ENV_ON_CREATE)
CONFIRM = Field(False, description="Confirm a command the policy marks as dangerous.")
SINCE_SEQ = Field(None, description="Return output after this chunk sequence number.")
SINCE_OFFSET = Field(None, description="Return output after this byte offset.")
MAX_BYTES = Field(None, description="At most this many bytes of output.")
MAX_CHARS = Field(None, description="At most this many characters (start and end are kept).")


class TerminalStartArgs(ToolArgs):
    command: str = Field(description="Shell command line (bash -c).")
    session_id: str | None = SESSION_ID
    policy: str | None = POLICY
    use_pty: bool = Field(True, description="Run in a pseudo-terminal (else pipes).")
    cwd: str | None = Field(None, description="Working directory under /workspace.")
    env: dict[str, str] | None = Field(None, description=CALL_ENV)
    session_env: dict[str, str] | None = NEW_SESSION_ENV
    yield_time_ms: int = Field(1000, description="Return after this long at the latest.")
    max_bytes: int | None = MAX_BYTES
    max_output_chars: int | None = MAX_CHARS
    confirm_dangerous: bool = CONFIRM


class TerminalReadArgs(ToolArgs):
    terminal_id: str = TERMINAL_ID
    since_seq: int | None = SINCE_SEQ
    since_offset: int | None = SINCE_OFFSET
    max_bytes: int | None = MAX_BYTES
    max_output_chars: int | None = MAX_CHARS


class TerminalWaitArgs(TerminalReadArgs):
    timeout_ms: int = Field(1000, description="Wait at most this long for new output or exit.")


class TerminalWriteArgs(ToolArgs):
    terminal_id: str = TERMINAL_ID
    input_text: str = Field(description="Text to send to the terminal's input.")
    close_stdin: bool = Field(False, description="Close input afterwards (pipes only).")


class TerminalIdArgs(ToolArgs):
    terminal_id: str = TERMINAL_ID


class TerminalKillArgs(ToolArgs):
    terminal_id: str = TERMINAL_ID
    signal: str | int = Field("TERM", description="Signal name or number; KILL follows a grace.")


class ResizeArgs(ToolArgs):
    terminal_id: str = TERMINAL_ID
    rows: int = Field(description="Rows of the PTY.")
    cols: int = Field(description="Columns of the PTY.")


class RunArgs(ToolArgs):
    command: str = Field(description="Command for the session's persistent shell.")
    session_id: str | None = SESSION_ID
    policy: str | None = POLICY
    timeout_s: float | None = Field(None, description="Seconds before it is interrupted.")
    env: dict[str, str] | None = Field(None, description=CALL_ENV)
    session_env: dict[str, str] | None = NEW_SESSION_ENV
    confirm_dangerous: bool = CONFIRM


async def _command_session(
    orch: SessionManager, tenant: str | None, args: TerminalStartArgs | RunArgs
) -> tuple[Session, bool]:
    """Find or create the session; a command its policy refuses creates none (the session's
    terminals and shell enforce the policy again, on every path)."""
    if args.session_id is None:
        policy = orch.policy(args.policy)
        enforce(args.command, policy, confirm_dangerous=args.confirm_dangerous)
    return await orch.open_session(
        args.session_id, policy=args.policy, tenant=tenant, session_env=args.session_env
    )


async def _start(orch: SessionManager, tenant: str | None, args: TerminalStartArgs) -> Fields:
    session, created = await _command_session(orch, tenant, args)
    result = await session.terminals.start(
        args.command,
        use_pty=args.use_pty,
        cwd=args.cwd,
        env=args.env,
        yield_time_ms=args.yield_time_ms,
        max_bytes=args.max_bytes,
        max_output_chars=args.max_output_chars,
        confirm_dangerous=args.confirm_dangerous,
    )
    return {"session_id": session.id, "created_new_session": created, **result.model_dump()}


def _reading(args: TerminalReadArgs) -> dict[str, Any]:
    return {
        "since_seq": args.since_seq,
        "since_offset": args.since_offset,
        "max_bytes": args.max_bytes,
        "max_output_chars": args.max_output_chars,
    }


async def _read(orch: SessionManager, tenant: str | None, args: TerminalReadArgs) -> Fields:
    session = await orch.session_of(TERMINAL, args.terminal_id, tenant=tenant, action="read")
    result = await session.terminals.read(args.terminal_id, **_reading(args))
    return {"session_id": session.id, **result.model_dump()}


async def _wait(orch: SessionManager, tenant: str | None, args: TerminalWaitArgs) -> Fields:
    session = await orch.session_of(TERMINAL, args.terminal_id, tenant=tenant, action="wait")
    result = await session.terminals.wait(
        args.terminal_id, timeout_ms=args.timeout_ms, **_reading(args)
    )
    await orch.session_of(
        TERMINAL, args.terminal_id, tenant=tenant, action="wait"
    )  # still theirs after the await
    return {"session_id": session.id, **result.model_dump()}


async def _write(orch: SessionManager, tenant: str | None, args: TerminalWriteArgs) -> Fields:
    session = await orch.session_of(TERMINAL, args.terminal_id, tenant=tenant, action="write")
    status = await session.terminals.write(
        args.terminal_id, args.input_text, close_stdin=args.close_stdin
    )
    return {"session_id": session.id, **status.model_dump()}


async def _interrupt(orch: SessionManager, tenant: str | None, args: TerminalIdArgs) -> Fields:
    session = await orch.session_of(TERMINAL, args.terminal_id, tenant=tenant, action="interrupt")
    status = await session.terminals.interrupt(args.terminal_id)
    return {"session_id": session.id, **status.model_dump()}


async def _kill(orch: SessionManager, tenant: str | None, args: TerminalKillArgs) -> Fields:
    session = await orch.session_of(TERMINAL, args.terminal_id, tenant=tenant, action="kill")
    status = await session.terminals.kill(args.terminal_id, signal=args.signal)
    return {"session_id": session.id, **status.model_dump()}


async def _resize(orch: SessionManager, tenant: str | None, args: ResizeArgs) -> Fields:
    session = await orch.session_of(TERMINAL, args.terminal_id, tenant=tenant, action="write")
    status = await session.terminals.resize(args.terminal_id, args.rows, args.cols)
    return {"session_id": session.id, **status.model_dump()}


async def _run(orch: SessionManager, tenant: str | None, args: RunArgs) -> Fields:
    session, created = await _command_session(orch, tenant, args)
    started = time.time()
    result = await session.shell.run(
        args.command,
        timeout_s=args.timeout_s,
        env=args.env,
        confirm_dangerous=args.confirm_dangerous,
    )
    fields: dict[str, Any] = {
        "session_id": session.id,
        "created_new_session": created,
        **result.model_dump(),
    }
    if result.timed_out:
        kept = "shell replaced, its state lost" if result.shell_restarted else "shell kept"
        fields |= {
            "success": False,
            "error_type": "timeout",
            "error_message": f"command timed out ({kept})",
        }
    if denied := await orch.network_denied_since(session.id, started, tenant=tenant):
        fields["network_denied"] = denied
    return fields


TERMINAL_TOOL = Tool(
    name="terminal",
    title="Terminals and shell",
    read_only_operations=frozenset({"read", "wait"}),
    open_world=True,
    description="Commands in a session: `run` in its persistent shell, or terminals.",
    operations={
        op.name: op
        for op in (
            Operation(
                "start",
                "start a command",
                TerminalStartArgs,
                _start,
            ),
            Operation("read", "output after since_seq or since_offset", TerminalReadArgs, _read),
            Operation("wait", "read once output or exit comes", TerminalWaitArgs, _wait),
            Operation("write", "send input", TerminalWriteArgs, _write),
            Operation("interrupt", "send SIGINT", TerminalIdArgs, _interrupt),
            Operation("kill", "a signal, then KILL", TerminalKillArgs, _kill),
            Operation("resize", "resize the PTY", ResizeArgs, _resize),
            Operation("run", "run in the shell (cwd, exports kept)", RunArgs, _run),
        )
    },
)
