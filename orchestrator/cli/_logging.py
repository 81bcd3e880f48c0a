"""How ``sandhold serve`` logs: ``text`` (lines for people) or ``json`` (one JSON object a line
for a log shipper), both through the standard library's ``logging`` on stderr.

A JSON event::

    {"time": "2025-01-02T03:04:05.678Z", "level": "info", "event": "python_repl.execute: ok in
     12.3 ms", "logger": "orchestrator.calls", "session": "…", "tenant": "local",
     "call_id": "9f2c…", "tool": "python_repl", "operation": "execute", "outcome": "ok",
     "duration_ms": 12.3}

``session``, ``tenant`` and ``call_id`` come from the call being served (``call_scope``), else
from the HTTP request's tenant, else are null; a record's own ``session`` (``extra=``) wins. The
event text is escaped by the JSON encoder, so nothing a caller sends can start a line of its own.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, Literal

from orchestrator._core import current_call

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(name)s: %(message)s"
# Fields a record may carry through ``extra=`` that an event keeps (the call line's).
EXTRA_FIELDS: Final = ("tool", "operation", "outcome", "duration_ms")


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # Here, not at the top: ``serve --help`` reads ``LogFormat`` from this module, and the
        # HTTP layer brings starlette and the MCP SDK.
        from orchestrator.http import current_tenant

        self._tenant: Callable[[], str | None] = current_tenant

    def format(self, record: logging.LogRecord) -> str:
        call = current_call()
        session = getattr(record, "session", None) or (call.session_id if call else None)
        event: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
            "session": session,
            "tenant": call.tenant if call else self._tenant(),
            "call_id": call.call_id if call else None,
        }
        event.update({k: getattr(record, k) for k in EXTRA_FIELDS if hasattr(record, k)})
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, ensure_ascii=True, default=str)


def _utc(created: float) -> str:
    moment = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


def configure_logging(log_format: LogFormat) -> None:
    """The root logger writes to stderr in ``log_format``: warnings from everyone, and
    information from sandhold itself (calls, sessions, reconciles)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("orchestrator").setLevel(logging.INFO)


def uvicorn_log_config(log_format: LogFormat) -> dict[str, Any] | None:
    """uvicorn's ``log_config``: its own for text; none for JSON, so that its loggers keep no
    handler of their own and their records reach the root's JSON handler."""
    if log_format == "json":
        return None
    from uvicorn.config import LOGGING_CONFIG

    return LOGGING_CONFIG
