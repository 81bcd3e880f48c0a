"""The engine seam: the one place above ``backend/`` that names an engine. A backend name (from
``OrchestratorConfig.backend``) becomes a ``Backend`` and the ``ImageSource`` its sessions' images
come from; everything else types against the protocols in ``backend.base``.

Adding an engine: a folder under ``backend/``, a branch in ``open_backend`` and in
``image_source``, its options in ``cli`` (``docs/concepts.md`` lists the files). Each engine is
imported only when chosen: the Docker SDK is slow to import, and a Kubernetes server never
needs it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from orchestrator.backend.base import Backend, ImageSource
from orchestrator.errors import InvalidArgumentError, TemplateNotBuiltError

if TYPE_CHECKING:  # types only: `sandhold ps` and `kill` import no settings model
    from orchestrator._core.config import BackendConfig, OrchestratorConfig
    from orchestrator.images.templates import TemplateCatalog

__all__ = ["ENGINES", "FixedImages", "image_source", "open_backend"]

# The names ``OrchestratorConfig.backend.name`` (and ``serve --backend``) accept.
ENGINES = ("docker", "kubernetes")
# The template whose image is the worker's own (``images.templates.BASE``, named here so that
# a server on Kubernetes never imports the image builder).
_BASE = "base"


def open_backend(
    config: BackendConfig | None = None, *, stats_concurrency: int | None = None
) -> Backend:
    """A connection to the engine ``config`` names (None: Docker's, as the engine's environment
    says; nothing is asked of it yet); ``stats_concurrency`` bounds how many engine calls run at
    once (``sandhold ps``)."""
    name = "docker" if config is None else config.name
    options: Mapping[str, object] = {} if config is None else config.options
    if name == "docker":
        from orchestrator.backend.docker import DockerBackend, DockerClient, EgressSettings

        if options:
            raise InvalidArgumentError(f"the docker backend takes no options: {sorted(options)}")
        client = (
            DockerClient()
            if stats_concurrency is None
            else DockerClient(max_concurrency=stats_concurrency)
        )
        return DockerBackend(client, egress=EgressSettings.from_env())
    if name == "kubernetes":
        from orchestrator.backend.kubernetes import KubernetesBackend, KubernetesSettings

        return KubernetesBackend(KubernetesSettings.from_options(options))
    raise InvalidArgumentError(f"unknown backend {name!r}: expected one of {', '.join(ENGINES)}")


def image_source(
    backend: Backend, config: OrchestratorConfig, catalog: Callable[[], TemplateCatalog]
) -> ImageSource:
    """Where ``backend``'s images come from: a Docker engine builds them (``images/``); any other
    engine has the images the configuration names (``image``, ``template_images``)."""
    # Only a loaded module can have made the backend: a Kubernetes server never imports Docker's.
    docker = sys.modules.get("orchestrator.backend.docker")
    if docker is not None and isinstance(backend, docker.DockerBackend):
        from orchestrator.images.source import DockerImageSource

        return DockerImageSource(backend.client, catalog, base_image=config.image)
    images = dict(config.template_images)
    if config.image is not None:
        images[_BASE] = config.image
    return FixedImages(images, engine=type(backend).__name__)


class FixedImages:
    """The images an operator placed where the engine finds them, by template name (a cluster's
    nodes, say): nothing is built, and a template without one says how to name it."""

    def __init__(self, images: Mapping[str, str], *, engine: str) -> None:
        self._images = dict(images)
        self._engine = engine

    async def image_for(self, template: str) -> str:
        if template in self._images:
            return self._images[template]
        if template == _BASE:
            raise InvalidArgumentError(
                f"a {self._engine} builds no worker image: set OrchestratorConfig.image "
                "(SANDHOLD_IMAGE for the commands)"
            )
        raise TemplateNotBuiltError(
            f"template {template!r} has no image, and a {self._engine} builds none",
            hint=f"set OrchestratorConfig.template_images[{template!r}]",
        )

    async def check_image(self, reference: str) -> bool | None:
        return None
