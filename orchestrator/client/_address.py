"""Where a client finds ``sandhold serve`` and how it names itself to it: the environment
variables every client reads (the CLI, the Sandbox API, ``sandhold mcp --connect``), the one
check of a server URL, and the headers a call carries."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Final

from orchestrator.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_URL",
    "DEPRECATED_URL_VARIABLE",
    "KEY_VARIABLE",
    "TASK_HEADER",
    "URL_VARIABLE",
    "URL_VARIABLE_DEPRECATION",
    "checked_url",
    "url_from_env",
]

# ``sandhold serve``'s own default address: what the CLI talks to when told nothing.
DEFAULT_URL: Final = "http://127.0.0.1:8080"
URL_VARIABLE: Final = "SANDHOLD_URL"
# The CLI's name for the address before issue 32: still read when SANDHOLD_URL is not set, with
# a warning, so one name works everywhere.
DEPRECATED_URL_VARIABLE: Final = "SANDHOLD_SERVER"
URL_VARIABLE_DEPRECATION: Final = (
    f"{DEPRECATED_URL_VARIABLE} is deprecated; set {URL_VARIABLE} instead"
)
KEY_VARIABLE: Final = "SANDHOLD_API_KEY"
# Scopes a call to one task of the key's tenant (docs/concepts.md, Task).
TASK_HEADER: Final = "X-Sandhold-Task"


def url_from_env(
    warn: Callable[[str], None], environ: Mapping[str, str] = os.environ
) -> str | None:
    """``SANDHOLD_URL``, else the deprecated ``SANDHOLD_SERVER`` (``warn`` is told so), else
    None. Each client warns its own way: the CLI on stderr, the Sandbox API as a
    DeprecationWarning."""
    if url := environ.get(URL_VARIABLE):
        return url
    if url := environ.get(DEPRECATED_URL_VARIABLE):
        warn(URL_VARIABLE_DEPRECATION)
        return url
    return None


def checked_url(url: str, *, name: str = "url") -> str:
    """``url`` without a trailing slash, when it is ``http(s)://host[:port][/path]``; otherwise
    ``invalid_argument`` naming the option (``name``) it came from."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidArgumentError(f"{name} must be http(s)://host:port, got {url!r}")
    return url.rstrip("/")
