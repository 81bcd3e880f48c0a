"""The call being served: its id, tenant and session, for whatever logs while it runs.

``Orchestrator.call`` opens a ``call_scope`` for each call (a context variable, so concurrent
calls each see their own, and a task the call starts inherits it); a log formatter reads it with
``current_call``. The call id is the one in the call's audit record and, for REST, in the
``X-Sandhold-Call-Id`` response header.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

__all__ = ["CALL_ID_BYTES", "CallContext", "call_scope", "current_call", "new_call_id"]

# 64 random bits: unique among the calls of any log one would search, short enough to read.
CALL_ID_BYTES: Final = 8


@dataclass(frozen=True)
class CallContext:
    call_id: str
    tenant: str
    session_id: str | None = None
    # Where output goes as it comes, for the operations that stream (python_repl execute):
    # ("stdout" or "stderr", text). Quick and non-blocking: it is called as frames are read.
    on_output: Callable[[str, str], None] | None = None
    # The session's egress attempts begun and ended during the call (attempts, denied, bytes_sent,
    # bytes_received), tallied where an operation reads its egress log, for the audit record.
    egress: dict[str, int] = field(default_factory=dict)


_current: ContextVar[CallContext | None] = ContextVar("sandhold_call", default=None)


def new_call_id() -> str:
    return secrets.token_hex(CALL_ID_BYTES)


def current_call() -> CallContext | None:
    """The call being served in this context, or None outside any call."""
    return _current.get()


@contextlib.contextmanager
def call_scope(context: CallContext) -> Iterator[CallContext]:
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
