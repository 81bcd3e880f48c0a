"""The one place sandhold calls the Docker SDK. The SDK is blocking, so every call runs in a worker
thread under a capacity limiter (a burst of sessions must not spawn a thread per call), and every
SDK or transport error is translated here into the sandhold error tree."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlparse

import anyio
import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions

from orchestrator.backend.docker._endpoint import (
    EngineEndpoint,
    endpoint_of,
    engine_kwargs,
)
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    ContainerNotFoundError,
    OrchestratorError,
)

P = ParamSpec("P")
T = TypeVar("T")

# Enough parallel engine calls for 20 sessions working at once; more only queues inside dockerd.
DEFAULT_MAX_CONCURRENCY = 16
# Engine calls are local; a minute covers a slow image import without hanging a caller forever.
DEFAULT_API_TIMEOUT = 60.0
ENGINE_HINT = "is the Docker engine running, and may this user reach its socket (DOCKER_HOST)?"


# The engine-neutral error, under the name this package's callers (images/) have always used.
NotFoundError = ContainerNotFoundError


@contextlib.contextmanager
def translate_docker_errors() -> Iterator[None]:
    """Map every Docker SDK / transport failure onto the sandhold error tree, exactly once."""
    try:
        yield
    except OrchestratorError:
        raise
    except docker.errors.NotFound as exc:
        raise NotFoundError(_explain(exc)) from exc
    except docker.errors.APIError as exc:
        if exc.status_code == 409 and "is not running" in _explain(exc):
            # Nothing runs in a stopped session container again as it was: its tmpfs and
            # processes are gone. An engine restarted without live-restore stops every container.
            raise NotFoundError(f"{_explain(exc)} (stopped or killed)") from exc
        raise BackendError(f"engine refused: {_explain(exc)}") from exc
    except (
        requests.exceptions.ConnectionError,
        # A response cut off mid-body (the engine died while streaming it).
        requests.exceptions.ChunkedEncodingError,
        urllib3.exceptions.ProtocolError,
        ConnectionError,
        FileNotFoundError,
    ) as exc:
        raise BackendUnavailableError("Docker engine not reachable", hint=ENGINE_HINT) from exc
    except requests.exceptions.JSONDecodeError as exc:
        # A body cut short or empty: seen for the stats of a container being removed meanwhile.
        raise BackendError(f"the engine sent an unreadable answer: {exc}") from exc
    except (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError) as exc:
        raise BackendUnavailableError(
            "Docker engine did not answer in time", hint=ENGINE_HINT
        ) from exc
    except docker.errors.DockerException as exc:
        if "connection" in str(exc).lower() or "socket" in str(exc).lower():
            raise BackendUnavailableError("Docker engine not reachable", hint=ENGINE_HINT) from exc
        raise BackendError(f"docker: {exc}") from exc


def _explain(exc: docker.errors.APIError) -> str:
    explanation = getattr(exc, "explanation", None)
    text = explanation.decode() if isinstance(explanation, bytes) else explanation
    return str(text or exc)


class DockerClient:
    """Owns one SDK client, created lazily in a worker thread on first use."""

    def __init__(
        self,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        api_timeout: float = DEFAULT_API_TIMEOUT,
    ) -> None:
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._max_concurrency = max_concurrency
        self._api_timeout = api_timeout
        self._sdk: Any = None
        self._endpoint: EngineEndpoint | None = None
        self._sdk_lock = threading.Lock()

    def _client(self) -> Any:
        with self._sdk_lock:
            if self._sdk is None:
                kwargs = engine_kwargs(os.environ)
                scheme = urlparse(str(kwargs.get("base_url", ""))).scheme
                # Without paramiko the SDK reaches ssh:// through the system's ssh client.
                shell_out = scheme == "ssh" and importlib.util.find_spec("paramiko") is None
                self._sdk = docker.DockerClient(
                    version="auto",
                    timeout=self._api_timeout,
                    use_ssh_client=shell_out,
                    # A connection per call in flight: past the SDK's 10, each extra one would be
                    # opened, used once and dropped with a warning.
                    max_pool_size=max(self._max_concurrency, 10),
                    **kwargs,
                )
                self._endpoint = endpoint_of(kwargs, str(self._sdk.api.api_version))
            return self._sdk

    async def endpoint(self) -> EngineEndpoint:
        """Where the attach streams connect, with the API version the SDK negotiated."""
        if self._endpoint is None:
            await self.call(lambda sdk: None)
        assert self._endpoint is not None
        return self._endpoint

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(sdk_client, *args, **kwargs)`` in a thread with errors translated."""

        def invoke() -> T:
            with translate_docker_errors():
                return fn(self._client(), *args, **kwargs)

        return await anyio.to_thread.run_sync(invoke, limiter=self._limiter)

    def call_blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """The same, for code already running in a worker thread."""
        with translate_docker_errors():
            return fn(self._client(), *args, **kwargs)

    async def ping(self) -> None:
        await self.call(lambda sdk: sdk.ping())

    async def aclose(self) -> None:
        with self._sdk_lock:
            sdk, self._sdk = self._sdk, None
            self._endpoint = None
        if sdk is not None:
            await anyio.to_thread.run_sync(functools.partial(sdk.close), limiter=self._limiter)
