"""The client side of ``sandhold serve``, shared by its three clients: ``sandhold call`` and
``sandhold shell --server`` (blocking, ``ServerClient``), the Sandbox API's remote transport
(async, over httpx2, in ``sandbox/``) and ``sandhold mcp --connect`` (blocking, ``posted``).
What they share lives here once: how long an answer is waited for and why, where the server is
found (``SANDHOLD_URL``) and how a URL is checked, what a client makes of an answer that is not
the tool contract, and how server-sent events are read.

Standard library and ``orchestrator.errors`` only, and nothing heavy at import (``http.client``
is imported by the first call): ``sandhold mcp --connect`` starts through it on every call of a
client that spawns a server per call. Sits just above the foundation; ``sandbox/`` and the
interfaces import it, it imports nothing of theirs.
"""

from orchestrator.client._address import (
    DEFAULT_URL,
    DEPRECATED_URL_VARIABLE,
    KEY_VARIABLE,
    TASK_HEADER,
    URL_VARIABLE,
    URL_VARIABLE_DEPRECATION,
    checked_url,
    url_from_env,
)
from orchestrator.client._answers import (
    ANSWER_MARGIN,
    ANSWER_TIMEOUT,
    CONNECT_TIMEOUT,
    MAX_ANSWER_BYTES,
    MAX_TIMEOUT_S,
    answer_timeout,
    failure,
    tool_result,
)
from orchestrator.client._blocking import Answer, ServerClient, posted
from orchestrator.client._events import Event, EventDecoder

__all__ = [
    "ANSWER_MARGIN",
    "ANSWER_TIMEOUT",
    "CONNECT_TIMEOUT",
    "DEFAULT_URL",
    "DEPRECATED_URL_VARIABLE",
    "KEY_VARIABLE",
    "MAX_ANSWER_BYTES",
    "MAX_TIMEOUT_S",
    "TASK_HEADER",
    "URL_VARIABLE",
    "URL_VARIABLE_DEPRECATION",
    "Answer",
    "Event",
    "EventDecoder",
    "ServerClient",
    "answer_timeout",
    "checked_url",
    "failure",
    "posted",
    "tool_result",
    "url_from_env",
]
