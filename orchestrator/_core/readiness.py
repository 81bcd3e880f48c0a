"""Readiness: can this orchestrator make a session now? The engine answers, the worker image is
there, the registry takes a write. Each check is bounded and says in a few words what is wrong;
liveness (``/healthz``) asks none of this.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import anyio

from orchestrator.backend.base import Backend, ImageSource
from orchestrator.errors import OrchestratorError
from orchestrator.registry.store import Registry

__all__ = ["CHECK_TIMEOUT", "OK", "UNCHECKED", "readiness"]

# A probe runs each check one after another; a load balancer's probe times out at a few seconds,
# and an engine that takes this long to answer a ping is not ready to make a session either.
CHECK_TIMEOUT: Final = 2.0
OK: Final = "ok"
# The backend has no image of ours to look for (only Docker's engine builds one).
UNCHECKED: Final = "unchecked"


async def readiness(
    backend: Backend, images: ImageSource, image: str | None, registry: Registry
) -> dict[str, str]:
    """Each check's answer: ``ok``, ``unchecked``, or what is wrong."""
    checks = {"engine": await _bounded(backend.ping)}
    if checks["engine"] != OK:
        checks["image"] = "not checked: the engine does not answer"
    else:
        checks["image"] = await _bounded(lambda: _image_present(images, image))
    checks["registry"] = await _bounded(_writer(registry))
    # A backend's own (kubernetes: whether the nodes honour the seccomp profile Pods get).
    for name, check in getattr(backend, "readiness_checks", lambda _: {})(image).items():
        checks[name] = await _bounded(check)
    return checks


async def _bounded(check: Callable[[], Awaitable[object]]) -> str:
    try:
        with anyio.fail_after(CHECK_TIMEOUT):
            answer = await check()
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT:g} s"
    except OrchestratorError as exc:
        return f"{exc.code}: {exc}"
    return answer if isinstance(answer, str) else OK


async def _image_present(images: ImageSource, image: str | None) -> str:
    if image is None:
        return "no worker image chosen yet"
    present = await images.check_image(image)
    if present is None:
        return UNCHECKED
    return OK if present else f"image {image} is missing"


def _writer(registry: Registry) -> Callable[[], Awaitable[None]]:
    async def write() -> None:
        # On the loop, like every registry write: one connection, whose transactions a thread
        # could interleave with.
        registry.probe_write()

    return write
