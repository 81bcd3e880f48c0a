"""The Docker Engine backend."""

from orchestrator.backend.docker._client import DockerClient, NotFoundError, translate_docker_errors
from orchestrator.backend.docker._egress import EgressSettings
from orchestrator.backend.docker.backend import DockerBackend

__all__ = [
    "DockerBackend",
    "DockerClient",
    "EgressSettings",
    "NotFoundError",
    "translate_docker_errors",
]
