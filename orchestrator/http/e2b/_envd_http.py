"""envd's plain HTTP routes: ``GET /health`` and ``/files`` (``GET ?path=`` the bytes of a
file; ``POST ?path=`` a file from an ``application/octet-stream`` body, or each part of a
``multipart/form-data`` body, a part's filename its path when no ``path`` is given).

A body comes through the front door (``orchestrator.http``), which bounds it raw and decoded
(``Content-Encoding: gzip`` is undone there as a stream, stopped at the cap) before this reads
a byte of it: a file is written in one tool call, so it is read whole, and only then encoded
(the policy's ``max_file_bytes`` bounds it again)."""

from __future__ import annotations

import posixpath
import re
import time
from typing import Any, Final

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.http import MAX_BODY_BYTES
from orchestrator.http.e2b._context import current_sandbox
from orchestrator.http.e2b._errors import e2b_error, status_of
from orchestrator.http.e2b._files import SandboxFiles
from orchestrator.http.e2b._paths import OutsideHomeError, to_e2b, to_sandhold
from orchestrator.http.e2b._signed import EXPIRED
from orchestrator.http.e2b._tooling import ToolCallError
from orchestrator.session.files.wire import MAX_METADATA_CHARS, MAX_METADATA_KEYS

__all__ = ["MAX_UPLOAD_BYTES", "envd_http"]

METADATA_HEADER: Final = "x-metadata-"
_TOKEN: Final = re.compile(r"[A-Za-z0-9!#$%&'*+\-.^_`|~]+")
_PRINTABLE: Final = re.compile(r"[\x20-\x7e]*")

# The front door's cap on every body (it is the same on every surface of the server).
MAX_UPLOAD_BYTES: Final = MAX_BODY_BYTES


def envd_http(orchestrator: Any) -> Starlette:
    async def health(request: Request) -> Response:
        return Response(status_code=204)

    async def read(request: Request) -> Response:
        if _expired(request):
            return e2b_error(401, EXPIRED)
        files = SandboxFiles(orchestrator, current_sandbox())
        try:
            path = to_sandhold(request.query_params.get("path", ""))
            data = await files.read(path)
        except OutsideHomeError as exc:
            return e2b_error(400, str(exc))
        except ToolCallError as exc:
            return e2b_error(status_of(exc), exc.message)
        return Response(data, media_type="application/octet-stream")

    async def write(request: Request) -> Response:
        if _expired(request):
            return e2b_error(401, EXPIRED)
        files = SandboxFiles(orchestrator, current_sandbox())
        try:
            metadata = _metadata(request)
            uploads = await _uploads(request)
            written = []
            for given, data in uploads:
                path = to_sandhold(given)
                await files.write(path, data, metadata)
                entry = {"name": posixpath.basename(path), "type": "file", "path": to_e2b(path)}
                written.append({**entry, "metadata": metadata} if metadata else entry)
        except (OutsideHomeError, ValueError) as exc:
            return e2b_error(400, str(exc))
        except ToolCallError as exc:
            return e2b_error(status_of(exc), exc.message)
        return JSONResponse(written)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/files", read, methods=["GET"]),
            Route("/files", write, methods=["POST"]),
        ]
    )


def _expired(request: Request) -> bool:
    """A signed URL past its ``signature_expiration`` (the signature itself was checked before
    the request reached a sandbox: ``_signed``)."""
    expiration = request.query_params.get("signature_expiration")
    if expiration is None or not expiration.lstrip("-").isdigit():
        return False
    return int(expiration) < time.time()


def _metadata(request: Request) -> dict[str, str]:
    """E2B's file metadata, from the ``X-Metadata-<key>`` headers of an upload: keys lowercased
    (as envd keeps them), each an HTTP token, values printable ASCII; bounded as the file helper
    reports them."""
    found: dict[str, str] = {}
    for name, value in request.headers.items():
        if not name.lower().startswith(METADATA_HEADER):
            continue
        key = name[len(METADATA_HEADER) :].lower()
        if not _TOKEN.fullmatch(key) or len(key) > MAX_METADATA_CHARS:
            raise ValueError(f"invalid metadata key {key[:64]!r}")
        if not _PRINTABLE.fullmatch(value) or len(value) > MAX_METADATA_CHARS:
            raise ValueError(f"invalid metadata value for key {key!r}")
        found[key] = value
    if len(found) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} metadata keys")
    return found


async def _uploads(request: Request) -> list[tuple[str, bytes]]:
    path = request.query_params.get("path")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        if path is None:
            raise ValueError("path is required")
        return [(path, await request.body())]
    form = await request.form(max_part_size=MAX_UPLOAD_BYTES)
    found = []
    for _, value in form.multi_items():
        if isinstance(value, UploadFile):
            name = path if path is not None and len(form) == 1 else value.filename
            if not name:
                raise ValueError("a part without a filename, and no path")
            found.append((name, await value.read()))
    if not found:
        raise ValueError("no file in the upload")
    return found
