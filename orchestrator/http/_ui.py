"""The operations page at ``/ui``: a static page (HTML, one script, one style sheet, shipped as
package data in ``http/ui/``) over the REST API; it needs no key to load and holds none.

The page asks for an API key, keeps it in the tab's ``sessionStorage`` (gone when the tab
closes, never in a cookie, a URL or the HTML) and sends it as ``Authorization: Bearer`` to the
``/v1/ops/*`` routes it polls every 2 s and to the tool routes its buttons call. Everything a
session's owner chose (task names, and in audit records tool and operation names as sent) is set
with ``textContent``, never parsed as HTML; the policy below makes the browser hold the page to
that (Trusted Types: no HTML sink accepts a string) and to scripts of its own origin only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

UI_PATH: Final = "/ui"
# What the page is made of: the path it is served at, the file, and its media type.
ASSETS: Final = {
    UI_PATH: ("index.html", "text/html; charset=utf-8"),
    f"{UI_PATH}/ui.js": ("ui.js", "text/javascript; charset=utf-8"),
    f"{UI_PATH}/ui.css": ("ui.css", "text/css; charset=utf-8"),
}
UI_PATHS: Final = frozenset(ASSETS)

# Only the page's own script and style; requests to its own origin only; no frames, no forms
# sent anywhere (the key form is handled by the script), no <base>; HTML sinks take no strings.
CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # The files change with the installed version; a stale script against a newer API is worse
    # than a refetch of a few kilobytes.
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files("orchestrator.http").joinpath("ui", name).read_bytes()


def _asset(content: bytes, media_type: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return Response(content, media_type=media_type, headers=SECURITY_HEADERS)

    return endpoint


def ui_routes() -> list[BaseRoute]:
    """One route per file of the page, each file read once, here."""
    return [
        Route(path, _asset(_read(name), media_type), methods=["GET"])
        for path, (name, media_type) in ASSETS.items()
    ]
