"""envd's ``process.Process`` service over sandhold terminals: ``Start`` (a command, or a PTY
for ``pty.create``) and ``Connect`` stream its events, ``SendInput`` writes its stdin,
``CloseStdin`` closes it, ``SendSignal`` kills it, ``Update`` resizes a PTY, ``List`` answers
what was started and still runs.

Every command is a terminal of the sandbox's session, made and read through the ``terminal``
tool; the session starts it from its long-lived spawner (``session/served_spawner``), not an
exec of its own, so a short command costs a few milliseconds. A stream polls the terminal with
``wait`` (bounded by ``POLL_TIMEOUT_MS``) and sends a keepalive each time nothing came; it ends
with the command, or when the client goes away (the command goes on running, as under envd,
until it ends or is killed). A command's ``pid`` is a number of this server's, unique in its
sandbox."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any, Final

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from starlette.types import Message, Receive, Scope, Send

from orchestrator.http import ConnectionReset
from orchestrator.http.e2b._context import current_sandbox
from orchestrator.http.e2b._demux import Demux, new_marker, with_stderr_marked
from orchestrator.http.e2b._envd import process_connect
from orchestrator.http.e2b._envd import process_pb as pb
from orchestrator.http.e2b._errors import connect_error
from orchestrator.http.e2b._paths import OutsideHomeError, to_sandhold
from orchestrator.http.e2b._sandboxes import Command, E2bSandbox
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["ProcessApplication", "ProcessService"]

# How long one wait for output lasts; a keepalive goes out after each that saw none, so the
# SDK's stream (and any proxy) never sits idle much longer than this.
POLL_TIMEOUT_MS: Final = 5_000
# A new command's start answers at its first output or its end, or after this: a short command
# is then one call with its output, and a silent one's start event is late by this at most.
START_YIELD_MS: Final = 50
SIGNALS: Final = {pb.Signal.SIGKILL: "KILL", pb.Signal.SIGTERM: "TERM"}
# The errors of a call into a sandbox that has ended.
GONE: Final = frozenset({"session_not_found", "session_lost"})


def _command_line(config: pb.ProcessConfig) -> str:
    args = list(config.args)
    if config.cmd in ("/bin/bash", "bash") and args[:2] == ["-l", "-c"] and len(args) == 3:
        return f"/bin/bash -l -c {shlex.quote(args[2])}"
    return shlex.join([config.cmd, *args])


def _cwd(config: pb.ProcessConfig) -> tuple[str | None, str]:
    """The terminal's cwd (a path under the home, mapped), or None with a ``cd`` to put before
    the command line: a directory outside the home (``/``, ``/tmp``) is not the files tool's to
    check, and the command's own shell goes there, as E2B's would (a missing one fails there)."""
    if not config.has_field("cwd") or not config.cwd:
        return None, ""
    try:
        return to_sandhold(config.cwd), ""
    except OutsideHomeError:
        return None, f"cd -- {shlex.quote(config.cwd)} && "


class SandboxGone(ConnectionReset):
    """The sandbox of a running command ended: its stream is cut off (the connection reset),
    not ended."""


# Set per request by ``ProcessApplication``: whether the stream's sandbox ended under it.
_gone: ContextVar[list[bool] | None] = ContextVar("e2b_process_gone", default=None)


class ProcessApplication:
    """envd's process service, whose stream is cut off (its last message never sent, the
    connection closed) when the sandbox ends while a command runs, as E2B's proxy drops it: an
    ending message would read as the command's own error. The SDK raises ``TimeoutException``.
    Over HTTP/2 (E2B's proxy) the drop is a stream reset; over this server's HTTP/1.1 it is
    the connection's (``ConnectionReset``): a close would be a malformed answer to the SDK's
    client, which then speaks of a timeout, while after a reset it probes the sandbox's health
    and says it was killed."""

    def __init__(self, service: Any, **options: Any) -> None:
        # The Connect application it wraps (what routes it serves is read off it).
        self.wrapped = process_connect.ProcessASGIApplication(service, **options)
        self.path: str = self.wrapped.path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = [False]
        token = _gone.set(gone)

        async def cut(message: Message) -> None:
            ends = message["type"] == "http.response.trailers" or (
                message["type"] == "http.response.body" and not message.get("more_body", False)
            )
            if gone[0] and ends:
                raise SandboxGone("the sandbox ended while its command ran")
            await send(message)

        try:
            await self.wrapped(scope, receive, cut)
        finally:
            _gone.reset(token)


def _mark_gone() -> None:
    gone = _gone.get()
    if gone is not None:
        gone[0] = True


class ProcessService:
    def __init__(self, orchestrator: Any) -> None:
        self._orchestrator = orchestrator

    async def _call(self, sandbox: E2bSandbox, tool: str, operation: str, **args: Any) -> Any:
        try:
            return await call(self._orchestrator, sandbox.tenant, tool, operation, **args)
        except ToolCallError as exc:
            raise connect_error(exc) from None

    def _command(self, sandbox: E2bSandbox, selector: pb.ProcessSelector | None) -> Command:
        chosen = selector.selector if selector is not None else None
        if chosen is not None and chosen.field == "pid" and chosen.value in sandbox.commands:
            return sandbox.commands[chosen.value]
        if chosen is not None and chosen.field == "tag":
            for command in sandbox.commands.values():
                if command.tag == chosen.value:
                    return command
        raise ConnectError(Code.NOT_FOUND, "process not found")

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.StartResponse]:
        sandbox = current_sandbox()
        config = request.process or pb.ProcessConfig()
        pty = request.pty if request.has_field("pty") else None
        cwd, cd = _cwd(config)
        line = cd + _command_line(config)
        marker = None if pty is not None else new_marker()
        command_line = with_stderr_marked(line, marker) if marker else line
        started = await self._call(
            sandbox,
            "terminal",
            "start",
            session_id=sandbox.session_id,
            command=command_line,
            use_pty=pty is not None,
            cwd=cwd,
            env=dict(config.envs) or None,
            yield_time_ms=START_YIELD_MS,
        )
        command = sandbox.add_command(
            terminal_id=started["terminal_id"],
            cmd=config.cmd,
            args=list(config.args),
            envs=dict(config.envs),
            cwd=config.cwd if config.has_field("cwd") else None,
            tag=request.tag if request.has_field("tag") else None,
            pty=pty is not None,
            stderr_marker=marker,
        )
        if pty is not None and pty.size is not None and pty.size.rows and pty.size.cols:
            await self._resize(sandbox, command, pty.size)
        yield pb.StartResponse(event=_event("start", pb.ProcessEvent.StartEvent(pid=command.pid)))
        async for event in self._events(sandbox, command, started, ctx):
            yield pb.StartResponse(event=event)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        sandbox = current_sandbox()
        command = self._command(sandbox, request.process)
        read = await self._call(sandbox, "terminal", "read", terminal_id=command.terminal_id)
        start = pb.ProcessEvent.StartEvent(pid=command.pid)
        yield pb.ConnectResponse(event=_event("start", start))
        async for event in self._events(sandbox, command, read, ctx):
            yield pb.ConnectResponse(event=event)

    async def _events(
        self,
        sandbox: E2bSandbox,
        command: Command,
        first: dict[str, Any],
        ctx: RequestContext[Any, Any],
    ) -> AsyncIterator[pb.ProcessEvent]:
        demux = Demux(command.stderr_marker) if command.stderr_marker else None
        answer = first
        while True:
            exited = answer["state"] == "exited"
            for event in _data(command, demux, answer["output"], final=exited):
                yield event
            if exited:
                code = answer["exit_code"] if answer["exit_code"] is not None else -1
                if code < 0 and await self._gone(sandbox, command):
                    _mark_gone()
                    raise ConnectError(Code.UNAVAILABLE, "the sandbox ended")
                end = pb.ProcessEvent.EndEvent(
                    exit_code=code, exited=True, status=f"exit status {code}"
                )
                sandbox.commands.pop(command.pid, None)
                yield _event("end", end)
                return
            if not answer["output"]:
                yield _event("keepalive", pb.ProcessEvent.KeepAlive())
            try:
                answer = await call(
                    self._orchestrator,
                    sandbox.tenant,
                    "terminal",
                    "wait",
                    terminal_id=command.terminal_id,
                    since_seq=answer["next_seq"],
                    timeout_ms=_poll_ms(ctx),
                )
            except ToolCallError as exc:
                if exc.error_type in GONE:
                    _mark_gone()
                raise connect_error(exc) from None

    async def _gone(self, sandbox: E2bSandbox, command: Command) -> bool:
        """Whether a command that ended without an exit status ended with its sandbox."""
        try:
            await call(
                self._orchestrator, sandbox.tenant, "terminal", "read",
                terminal_id=command.terminal_id,
            )  # fmt: skip
        except ToolCallError as exc:
            return exc.error_type in GONE
        return False

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any]) -> pb.ListResponse:
        sandbox = current_sandbox()
        infos = []
        for command in list(sandbox.commands.values()):
            config = pb.ProcessConfig(
                cmd=command.cmd, args=command.args, envs=command.envs, cwd=command.cwd
            )
            infos.append(pb.ProcessInfo(config=config, pid=command.pid, tag=command.tag))
        return pb.ListResponse(processes=infos)

    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendInputResponse:
        sandbox = current_sandbox()
        command = self._command(sandbox, request.process)
        given = request.input.input if request.input is not None else None
        data = given.value if given is not None else b""
        await self._call(
            sandbox,
            "terminal",
            "write",
            terminal_id=command.terminal_id,
            input_text=data.decode("utf-8", "replace"),
        )
        return pb.SendInputResponse()

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CloseStdinResponse:
        sandbox = current_sandbox()
        command = self._command(sandbox, request.process)
        await self._call(
            sandbox,
            "terminal",
            "write",
            terminal_id=command.terminal_id,
            input_text="",
            close_stdin=True,
        )
        return pb.CloseStdinResponse()

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendSignalResponse:
        sandbox = current_sandbox()
        command = self._command(sandbox, request.process)
        name = SIGNALS.get(request.signal, "KILL")
        await self._call(sandbox, "terminal", "kill", terminal_id=command.terminal_id, signal=name)
        return pb.SendSignalResponse()

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any]
    ) -> pb.UpdateResponse:
        sandbox = current_sandbox()
        command = self._command(sandbox, request.process)
        if request.pty is not None and request.pty.size is not None:
            await self._resize(sandbox, command, request.pty.size)
        return pb.UpdateResponse()

    async def stream_input(self, request: Any, ctx: RequestContext[Any, Any]) -> Any:
        raise ConnectError(
            Code.UNIMPLEMENTED, "StreamInput is not supported by sandhold: use SendInput"
        )

    async def _resize(self, sandbox: E2bSandbox, command: Command, size: pb.PTY.Size) -> None:
        await self._call(
            sandbox,
            "terminal",
            "resize",
            terminal_id=command.terminal_id,
            rows=size.rows,
            cols=size.cols,
        )


def _poll_ms(ctx: RequestContext[Any, Any]) -> int:
    """How long the next wait for output may last: ``POLL_TIMEOUT_MS``, or less when the
    stream's deadline (the SDK's ``timeout``, sent as ``connect-timeout-ms``) is nearer. The
    Connect server does not end a stream at its deadline; the stream does, as envd's does, with
    ``DEADLINE_EXCEEDED`` (the SDK's ``TimeoutException``). The command goes on running."""
    remaining = ctx.timeout_ms
    if remaining is None:
        return POLL_TIMEOUT_MS
    if remaining <= 0:
        raise ConnectError(Code.DEADLINE_EXCEEDED, "the command's stream reached its timeout")
    return max(1, min(POLL_TIMEOUT_MS, int(remaining)))


def _event(kind: str, value: Any) -> pb.ProcessEvent:
    return pb.ProcessEvent(event=Oneof(kind, value))


def _data(
    command: Command, demux: Demux | None, text: str, *, final: bool
) -> list[pb.ProcessEvent]:
    if demux is None:
        if not text:
            return []
        return [_output("pty", text)]
    out, err = demux.feed(text, final=final)
    return [_output(name, text) for name, text in (("stdout", out), ("stderr", err)) if text]


def _output(stream: str, text: str) -> pb.ProcessEvent:
    data = Oneof(stream, text.encode())
    return _event("data", pb.ProcessEvent.DataEvent(output=data))
