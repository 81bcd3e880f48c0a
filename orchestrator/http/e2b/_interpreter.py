"""E2B's code interpreter (port 49999): ``POST /execute`` runs a cell in the sandbox's Python
REPL (``python_repl`` ``execute``) and answers NDJSON as the cell runs: ``stdout`` and
``stderr`` lines while it prints, then its ``result`` bundles (PNG figures, HTML tables...),
its ``error`` with the traceback, ``number_of_executions`` and ``end_of_execution``.

Contexts are the session's REPL contexts (``python_repl`` ``create_context`` and the rest): the
sandbox's own REPL is the ``default`` context; ``POST /contexts`` makes one (language, cwd),
``GET`` lists them, ``DELETE`` removes one and ``/restart`` clears one. ``/execute`` runs in
``context_id``, or in ``language``'s own context (Python's is the default one). Paths are shown
as E2B's (``/home/user``) and kept as sandhold's (``/workspace``). A language sandhold has no
kernel for is refused with 400, as is a context of another language under a restricted policy
(E2B's ``code-interpreter-v1`` is unrestricted)."""

from __future__ import annotations

import ast
import datetime
import json
import math
from typing import Any, Final

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator.http.e2b._context import current_sandbox
from orchestrator.http.e2b._errors import e2b_error, status_of
from orchestrator.http.e2b._paths import WORKSPACE, OutsideHomeError, to_e2b, to_sandhold
from orchestrator.http.e2b._sandboxes import E2bSandbox
from orchestrator.http.e2b._tooling import ToolCallError, call

__all__ = ["Interpreter", "result_of"]

# The errors of a call whose sandbox is gone.
GONE: Final = frozenset({"session_not_found", "session_lost"})
_MIME: Final = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "text/latex": "latex",
    "application/json": "json",
    "application/pdf": "pdf",
    "application/javascript": "javascript",
    "application/vnd.sandhold.data+json": "data",
}


# JavaScript's own context, listed before its first use as E2B lists it (its id is the
# language's name), where the image has Debian's node.
JAVASCRIPT: Final = "javascript"
NODE_PACKAGE: Final = "nodejs"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _line(kind: str, **fields: Any) -> bytes:
    return (json.dumps({"type": kind, **fields}) + "\n").encode()


def result_of(bundle: dict[str, Any]) -> dict[str, Any]:
    """A sandhold MIME bundle as E2B's ``Result``: one field per representation."""
    result: dict[str, Any] = {"is_main_result": bool(bundle.get("is_main_result", False))}
    for mime, value in bundle.items():
        if mime in _MIME:
            result[_MIME[mime]] = value
    if result["is_main_result"] and [m for m in bundle if m in _MIME] == ["text/plain"]:
        result["text"] = _unquoted(result["text"])
    return result


def _unquoted(text: Any) -> Any:
    """E2B's Python kernel shows a str result as the string itself, where a REPL (sandhold's
    ``result``) shows its repr: a text that is one str literal, and nothing else, is given
    unquoted. Only a quoted text is parsed (one token: no nesting to exhaust), and a repr cut
    short by the worker's bound does not parse and stays as it is."""
    if not isinstance(text, str) or text[:1] not in ("'", '"'):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, str) else text


def _context(info: dict[str, Any]) -> dict[str, Any]:
    """A sandhold context as E2B's: its cwd always given, as E2B's home."""
    return {
        "id": info["id"],
        "language": info["language"],
        "cwd": to_e2b(info.get("cwd") or WORKSPACE),
    }


class SandboxKilled(Exception):
    """The sandbox of a running ``/execute`` ended: its response is cut off, not ended."""


class Interpreter:
    def __init__(self, orchestrator: Any) -> None:
        self._orchestrator = orchestrator

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/execute", self.execute, methods=["POST"]),
                Route("/contexts", self.list_contexts, methods=["GET"]),
                Route("/contexts", self.create_context, methods=["POST"]),
                Route("/contexts/{context_id}/restart", self.restart, methods=["POST"]),
                Route("/contexts/{context_id}", self.delete_context, methods=["DELETE"]),
                Route("/health", self.health, methods=["GET"]),
            ]
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def execute(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return e2b_error(400, "the body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            return e2b_error(400, "code is required")
        language, context = body.get("language"), body.get("context_id")
        if language is not None and context is not None:
            return e2b_error(400, "give context_id or language, not both")
        if language is not None and not isinstance(language, str):
            return e2b_error(400, "language must be a string")
        sandbox = current_sandbox()
        if context is not None and not await self._exists(sandbox, context):
            return e2b_error(404, f"context {str(context)[:80]!r} not found")
        envs = body.get("env_vars") or None
        return StreamingResponse(
            self._stream(sandbox, body["code"], envs, context or language),
            media_type="application/x-ndjson",
        )

    async def _exists(self, sandbox: E2bSandbox, context: object) -> bool:
        return context in [c["id"] for c in await self._contexts(sandbox)]

    async def _contexts(self, sandbox: E2bSandbox) -> list[dict[str, Any]]:
        listed = await call(
            self._orchestrator, sandbox.tenant, "python_repl", "list_contexts",
            session_id=sandbox.session_id,
        )  # fmt: skip
        return list(listed["contexts"])

    async def _stream(self, sandbox: E2bSandbox, code: str, envs: Any, context: Any) -> Any:
        send, receive = anyio.create_memory_object_stream[bytes](math.inf)
        outcome: dict[str, Any] = {}

        async def run() -> None:
            try:
                outcome["result"] = await call(
                    self._orchestrator,
                    sandbox.tenant,
                    "python_repl",
                    "execute",
                    code=code,
                    session_id=sandbox.session_id,
                    env=envs,
                    context=context,
                    user_errors_are_data=True,
                    on_stdout=lambda text: send.send_nowait(
                        _line("stdout", text=text, timestamp=_now())
                    ),
                    on_stderr=lambda text: send.send_nowait(
                        _line("stderr", text=text, timestamp=_now())
                    ),
                )
            except ToolCallError as exc:
                outcome["error"] = exc
            finally:
                send.close()

        async with anyio.create_task_group() as group, receive:
            group.start_soon(run)
            async for line in receive:
                yield line
        if await self._killed(sandbox, outcome):
            # E2B's proxy drops the connection of a sandbox killed mid-run; the SDK then finds
            # the sandbox gone and raises its "killed" error. An ending here would read as the
            # cell's own error.
            raise SandboxKilled(sandbox.sandbox_id)
        for line in self._ending(sandbox, outcome):
            yield line

    async def _killed(self, sandbox: E2bSandbox, outcome: dict[str, Any]) -> bool:
        """Whether the sandbox ended while its cell ran (a kill, its lifetime, a lost engine)."""
        failed: ToolCallError | None = outcome.get("error")
        if failed is not None:
            return failed.error_type in GONE
        if outcome["result"].get("error_type") != "process_crashed":
            return False
        try:
            await self._contexts(sandbox)
        except ToolCallError as exc:
            return exc.error_type in GONE
        return False

    def _ending(self, sandbox: E2bSandbox, outcome: dict[str, Any]) -> list[bytes]:
        lines = []
        failed: ToolCallError | None = outcome.get("error")
        if failed is not None:
            lines.append(_line("error", name=failed.error_type, value=failed.message, traceback=""))
        else:
            result = outcome["result"]
            for bundle in result.get("results") or []:
                lines.append(_line("result", **result_of(bundle)))
            if not result.get("success", False):
                lines.append(
                    _line(
                        "error",
                        name=str(result.get("error_type") or "Error"),
                        value=str(result.get("error_message") or ""),
                        traceback=str(result.get("traceback") or ""),
                    )
                )
        sandbox.executions += 1
        lines.append(_line("number_of_executions", execution_count=sandbox.executions))
        lines.append(_line("end_of_execution"))
        return lines

    async def list_contexts(self, request: Request) -> Response:
        """The sandbox's contexts, and JavaScript's own default among them before its first use
        where the sandbox can run it, as E2B lists a default context per language up front (it
        is made on first use: ``contexts.for_language``)."""
        sandbox = current_sandbox()
        try:
            contexts = await self._contexts(sandbox)
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        listed = [_context(c) for c in contexts]
        if JAVASCRIPT not in {c["language"] for c in listed} and self._runs_javascript(sandbox):
            # Beside Python's default, before the made ones: the newest context is listed last.
            made = next((i for i, c in enumerate(listed) if c["id"] != "default"), len(listed))
            listed.insert(
                made, {"id": JAVASCRIPT, "language": JAVASCRIPT, "cwd": to_e2b(WORKSPACE)}
            )
        return JSONResponse(listed)

    def _runs_javascript(self, sandbox: E2bSandbox) -> bool:
        """Whether the sandbox's image has node (a template of its policy's chain installs it)
        and its policy lets contexts other than Python's run."""
        policy = self._orchestrator.policy(sandbox.policy)
        if policy.python.mode == "restricted":
            return False
        chain = self._orchestrator.templates().chain(policy.image.template)
        return any(NODE_PACKAGE in template.debs for template in chain)

    async def create_context(self, request: Request) -> Response:
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return e2b_error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return e2b_error(400, "the body must be a JSON object")
        cwd = body.get("cwd")
        try:
            cwd = to_sandhold(cwd) if isinstance(cwd, str) else cwd
        except OutsideHomeError as exc:
            return e2b_error(400, str(exc))
        sandbox = current_sandbox()
        try:
            made = await call(
                self._orchestrator, sandbox.tenant, "python_repl", "create_context",
                session_id=sandbox.session_id, language=body.get("language") or "python",
                cwd=cwd or WORKSPACE,
            )  # fmt: skip
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        return JSONResponse(_context(made["context"]))

    async def restart(self, request: Request) -> Response:
        return await self._on_context(request, "restart_context", 204)

    async def delete_context(self, request: Request) -> Response:
        return await self._on_context(request, "remove_context", 204)

    async def _on_context(self, request: Request, operation: str, status: int) -> Response:
        sandbox = current_sandbox()
        context = request.path_params["context_id"]
        try:
            if not await self._exists(sandbox, context):
                return e2b_error(404, f"context {context[:80]!r} not found")
            await call(
                self._orchestrator, sandbox.tenant, "python_repl", operation,
                session_id=sandbox.session_id, context=context,
            )  # fmt: skip
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        return Response(status_code=status)
