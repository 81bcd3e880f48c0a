"""Signed file URLs (the SDK's ``download_url`` and ``upload_url``): ``/files`` with
``signature`` (and ``signature_expiration``) in the query instead of the sandbox's headers.

The SDK signs ``path:operation:username:token[:expiration]`` with the sandbox's access token
(``v1_`` + the unpadded base64 of its sha256; the operation ``read`` for a download, ``write``
for an upload). With ``E2B_SANDBOX_URL`` set the URL carries no sandbox id, so the sandbox is
the one whose token makes that signature; every sandbox is tried, each compared in constant
time, so a wrong signature tells nothing about which sandboxes exist. A signature that matches
but whose expiration has passed still names its sandbox (it was made with the token), and the
request is then refused as envd refuses it: ``401 signature is already expired``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
from collections.abc import Iterable
from typing import Final

from starlette.types import Scope

from orchestrator.http.e2b._sandboxes import E2bSandbox

__all__ = ["EXPIRED", "as_sandbox_request", "signed_request"]

EXPIRED: Final = "signature is already expired"
_PREFIX: Final = "v1_"
_OPERATIONS: Final = {"GET": "read", "POST": "write"}


def _signature(path: str, operation: str, user: str, token: str, expiration: str | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration else "")
    digest = hashlib.sha256(raw.encode("utf-8")).digest()
    return _PREFIX + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def signed_request(scope: Scope, sandboxes: Iterable[E2bSandbox]) -> E2bSandbox | None:
    """The sandbox a signed ``/files`` request is for, or None (not one, or no match); an
    expired signature still names it (``_envd_http`` refuses it)."""
    if scope.get("type") != "http" or scope.get("path") != "/files":
        return None
    operation = _OPERATIONS.get(str(scope.get("method")))
    query = urllib.parse.parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
    given = query.get("signature", [""])[0]
    if operation is None or not given.startswith(_PREFIX):
        return None
    path = query.get("path", [""])[0]
    user = query.get("username", [""])[0]
    expiration = query.get("signature_expiration", [None])[0]
    found = None
    for sandbox in sandboxes:
        expected = _signature(path, operation, user, sandbox.access_token, expiration)
        if hmac.compare_digest(expected.encode(), given.encode()):
            found = sandbox
    return found


def as_sandbox_request(scope: Scope, sandboxes: Iterable[E2bSandbox]) -> E2bSandbox | None:
    """For a signed request (``signed_request``): its sandbox, whose id and access token are
    now in the request's headers."""
    sandbox = signed_request(scope, sandboxes)
    if sandbox is not None:
        scope["headers"] = [
            *scope.get("headers", ()),
            (b"e2b-sandbox-id", sandbox.sandbox_id.encode("latin-1")),
            (b"x-access-token", sandbox.access_token.encode("latin-1")),
        ]
    return sandbox
