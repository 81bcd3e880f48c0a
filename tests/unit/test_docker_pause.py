"""A pause the runtime gave up on (runc's ``unable to freeze``, which thaws the container back)
is ``backend_unavailable``, to be tried again, never ``internal``; other refusals stay what they
were. Seen twice in a 10-minute soak on a loaded host (bench/soak.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import docker.errors
import pytest
import requests

from orchestrator.backend.docker import DockerBackend
from orchestrator.backend.docker._client import translate_docker_errors
from orchestrator.errors import BackendError

pytestmark = pytest.mark.anyio

FROZEN_FAILED = (
    "Cannot pause container 8d4e1607: OCI runtime pause failed: unable to freeze: unknown"
)


class _Refusing:
    """An engine client whose every call the engine answers with ``status`` and ``message``."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        response = requests.Response()
        response.status_code = self.status
        with translate_docker_errors():
            raise docker.errors.APIError("refused", response=response, explanation=self.message)


async def test_a_freeze_the_runtime_gave_up_on_is_backend_unavailable() -> None:
    backend = DockerBackend(_Refusing(500, FROZEN_FAILED))  # type: ignore[arg-type]
    with pytest.raises(BackendError) as caught:
        await backend.pause("8d4e1607")
    assert caught.value.code == "backend_unavailable"
    assert "unable to freeze" in str(caught.value) and "runs on" in str(caught.value)


async def test_another_refused_pause_is_not_dressed_up() -> None:
    backend = DockerBackend(_Refusing(500, "Cannot pause container x: something else"))  # type: ignore[arg-type]
    with pytest.raises(BackendError) as caught:
        await backend.pause("x")
    assert caught.value.code == "internal"
