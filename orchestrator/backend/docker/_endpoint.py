"""Where the engine is and how to reach it: the one reading of ``DOCKER_HOST``,
``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH`` and the current docker context, shared by the SDK
client and the raw attach streams, and the API version the SDK negotiated with the engine.

The SDK and the raw streams must agree: a stream that attaches to another engine, or speaks a
version the engine refuses (Docker 29 refuses everything below 1.44), breaks every session. So
the endpoint is resolved once, from the same keyword arguments the SDK client was made with, and
carries the negotiated version instead of a constant.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import anyio
import anyio.abc
import docker
import docker.errors
import docker.utils

from orchestrator.errors import BackendUnavailableError

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
# Docker's registered ports: plain TCP and TLS.
PLAIN_PORT = 2375
TLS_PORT = 2376
# Connecting is local (or one network hop); a second means the engine is stuck, not slow.
CONNECT_TIMEOUT = 10.0
# Transports the attach streams speak; the SDK alone reaches the others (ssh, npipe).
ATTACHABLE = ("unix", "tcp", "http", "https")


def engine_kwargs(environ: Mapping[str, str]) -> dict[str, Any]:
    """``base_url`` and ``tls`` for the SDK client: the environment first, else the current
    docker context (``DOCKER_CONTEXT``, then ``~/.docker/config.json``), as the docker CLI does."""
    try:
        kwargs: dict[str, Any] = docker.utils.kwargs_from_env(environment=dict(environ))
        if "base_url" not in kwargs:
            context = docker.ContextAPI.kwargs_from_context(environment=dict(environ))
            kwargs.update({key: value for key, value in context.items() if value})
    except docker.errors.DockerException as exc:
        # Incomplete TLS material (DOCKER_CERT_PATH without its files) or a broken context.
        raise BackendUnavailableError(
            f"cannot tell how to reach the Docker engine: {exc}",
            hint="check DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH and `docker context ls`",
        ) from exc
    return kwargs


@dataclass(frozen=True)
class EngineEndpoint:
    """One engine: its URL as configured, the API version to speak, and TLS when it uses it."""

    url: str
    api_version: str
    tls: ssl.SSLContext | None = None

    @property
    def scheme(self) -> str:
        return urlparse(self.url).scheme

    def describe(self) -> str:
        return f"{self.url} (API {self.api_version}{', TLS' if self.tls else ''})"

    async def connect(self) -> anyio.abc.ByteStream:
        """A new connection to the engine; ``BackendUnavailableError`` naming the transport when
        it cannot be made here."""
        url = urlparse(self.url)
        if url.scheme not in ATTACHABLE:
            raise BackendUnavailableError(
                f"attached streams cannot use {url.scheme}:// yet (engine {self.url})",
                hint="reach the engine over unix:// or tcp:// (TLS included), e.g. by forwarding "
                "its socket: ssh -L /tmp/docker.sock:/var/run/docker.sock HOST",
            )
        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                if url.scheme == "unix":
                    return await connect_unix(url.path)
                host = url.hostname or "localhost"
                if self.tls is not None:
                    return await anyio.connect_tcp(
                        host,
                        url.port or TLS_PORT,
                        ssl_context=self.tls,
                        tls_hostname=host,
                        tls_standard_compatible=False,
                    )
                return await anyio.connect_tcp(host, url.port or PLAIN_PORT)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise BackendUnavailableError(f"cannot connect to the engine at {self.url}") from exc


def endpoint_of(kwargs: Mapping[str, Any], api_version: str) -> EngineEndpoint:
    """The endpoint the SDK client made from ``kwargs`` reaches, speaking ``api_version``."""
    url = str(kwargs.get("base_url") or DEFAULT_DOCKER_HOST)
    tls_config = kwargs.get("tls")
    tls = _ssl_context(tls_config) if tls_config else None
    if tls is None and urlparse(url).scheme == "https":
        tls = ssl.create_default_context()
    return EngineEndpoint(url=url, api_version=api_version, tls=tls)


def _ssl_context(config: Any) -> ssl.SSLContext:
    """The SDK's ``TLSConfig`` as an ``ssl`` context: its CA when it verifies, its client cert."""
    if config is True:
        return ssl.create_default_context()
    verify = bool(getattr(config, "verify", False))
    ca_cert = getattr(config, "ca_cert", None)
    context = ssl.create_default_context(cafile=ca_cert if verify and ca_cert else None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert = getattr(config, "cert", None)
    if isinstance(cert, tuple):
        context.load_cert_chain(cert[0], cert[1])
    elif isinstance(cert, str):
        context.load_cert_chain(cert)
    return context


async def connect_unix(path: str) -> anyio.abc.SocketStream:
    """``anyio.connect_unix`` without its race: while the engine's listen queue is full it
    waits for the socket to turn writable with a bare ``Future.set_result`` as the loop's
    callback, and a connect cancelled (``CONNECT_TIMEOUT``, a task group closing) just as the
    socket turned writable had that callback set a cancelled future: an ``InvalidStateError``
    in the event loop, outside any task. ``anyio.wait_writable`` guards against it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        while True:
            try:
                sock.connect(path)
            except BlockingIOError:  # the listen queue is full: a unix connect is retried
                await anyio.wait_writable(sock)
            else:
                return await anyio.abc.UNIXSocketStream.from_socket(sock)
    except BaseException:
        sock.close()
        raise
