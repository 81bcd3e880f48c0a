"""Docker SDK and transport failures become errors of our tree, never a traceback."""

from __future__ import annotations

import pytest
import requests

from orchestrator.backend.docker._client import translate_docker_errors
from orchestrator.errors import BackendError


def test_an_unreadable_engine_answer_is_a_backend_error() -> None:
    # What the SDK raises when a stats body comes back empty (the container went meanwhile).
    with pytest.raises(BackendError) as caught, translate_docker_errors():
        raise requests.exceptions.JSONDecodeError("Expecting value", "", 0)
    assert caught.value.code == "internal"
