"""Results made into text every interface can carry. A Python ``str`` may hold lone surrogates
(``'\\ud800'`` from a ``__repr__``, an exception message, stdout decoded with ``surrogateescape``),
which no UTF-8 encoder accepts: the MCP SDK's serialiser, Starlette's ``JSONResponse`` and any
client's would fail on them, ending a stdio server or a connection. ``call_tool`` replaces each
one with U+FFFD before a result leaves the tool layer and says so with ``UNICODE_REPLACED``.

The check is the fast path (ASCII strings, the usual case, are passed over by ``str.isascii``);
a result is rebuilt only when it holds something to replace.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
UNICODE_REPLACED = "unicode_replaced"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(value: Any) -> bool:
    """Whether any string in a JSON-shaped value (keys included) holds a lone surrogate."""
    if isinstance(value, str):
        return not value.isascii() and _LONE_SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(has_lone_surrogate(k) or has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_lone_surrogate(item) for item in value)
    return False


def replace_lone_surrogates(value: Any) -> Any:
    """A copy of a JSON-shaped value with every lone surrogate replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {replace_lone_surrogates(k): replace_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [replace_lone_surrogates(item) for item in value]
    return value


def valid_unicode(structured: dict[str, Any]) -> dict[str, Any]:
    """``structured`` itself when it is valid text throughout, else a copy with each lone
    surrogate replaced and ``UNICODE_REPLACED`` set."""
    if not has_lone_surrogate(structured):
        return structured
    replaced: dict[str, Any] = replace_lone_surrogates(structured)
    replaced[UNICODE_REPLACED] = True
    return replaced
