"""The sandbox a data-plane request is for: set by the dispatcher once the request's sandbox
id and access token matched, read by the services the Connect application calls (which
hand them only the message and its context)."""

from __future__ import annotations

import contextvars

from orchestrator.http.e2b._sandboxes import E2bSandbox

__all__ = ["current_sandbox", "sandbox_scope"]

_CURRENT: contextvars.ContextVar[E2bSandbox] = contextvars.ContextVar("e2b_sandbox")


def current_sandbox() -> E2bSandbox:
    return _CURRENT.get()


def sandbox_scope(sandbox: E2bSandbox) -> contextvars.Token[E2bSandbox]:
    return _CURRENT.set(sandbox)
