"""E2B's code interpreter (port 49999): ``POST /execute`` runs a cell in the sandbox's Python
REPL (``python_repl`` ``execute``) and answers NDJSON as the cell runs: ``stdout`` and
``stderr`` lines while it prints, then its ``result`` bundles (PNG figures, HTML tables...),
its ``error`` with the traceback, ``number_of_executions`` and ``end_of_execution``.

Contexts: the sandbox's one REPL is its default context (``GET /contexts`` lists it, restart
resets it). New contexts and languages other than Python are refused with a message saying so
(501 and 400): sandhold has one REPL a session and no other kernel."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any, Final

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator.e2b._context import current_sandbox
from orchestrator.e2b._errors import e2b_error, status_of
from orchestrator.e2b._paths import HOME
from orchestrator.e2b._sandboxes import E2bSandbox
from orchestrator.e2b._tooling import ToolCallError, call

__all__ = ["Interpreter", "result_of"]

DEFAULT_CONTEXT: Final = "default"
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
}


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
    return result


def _context(sandbox: E2bSandbox) -> dict[str, Any]:
    return {"id": DEFAULT_CONTEXT, "language": "python", "cwd": HOME}


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
        language = body.get("language")
        if language not in (None, "python", "py"):
            return e2b_error(400, f"language {language!r} is not supported: sandhold runs Python")
        context = body.get("context_id")
        if context not in (None, DEFAULT_CONTEXT):
            return e2b_error(404, f"context {context!r} not found")
        envs = body.get("env_vars") or None
        sandbox = current_sandbox()
        return StreamingResponse(
            self._stream(sandbox, body["code"], envs), media_type="application/x-ndjson"
        )

    async def _stream(self, sandbox: E2bSandbox, code: str, envs: Any) -> Any:
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
        for line in self._ending(sandbox, outcome):
            yield line

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
        return JSONResponse([_context(current_sandbox())])

    async def create_context(self, request: Request) -> Response:
        return e2b_error(
            501, "new contexts are not supported by sandhold: a sandbox has one Python REPL"
        )

    async def restart(self, request: Request) -> Response:
        if request.path_params["context_id"] != DEFAULT_CONTEXT:
            return e2b_error(404, "context not found")
        sandbox = current_sandbox()
        try:
            await call(
                self._orchestrator, sandbox.tenant, "python_repl", "reset",
                session_id=sandbox.session_id,
            )  # fmt: skip
        except ToolCallError as exc:
            return e2b_error(status_of(exc), f"{exc.error_type}: {exc.message}")
        return Response(status_code=204)

    async def delete_context(self, request: Request) -> Response:
        return e2b_error(
            501, "contexts cannot be deleted in sandhold: the default one lives with the sandbox"
        )
