"""The image source of a Docker engine (``backend.base.ImageSource``): each template's image,
built on the engine when missing and found current by its content-hashed tag otherwise. The
worker image of the ``base`` template is built once per source (or is the one configured), and
every other template is built on it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.backend.docker import DockerClient
from orchestrator.images.build import ensure_worker_image
from orchestrator.images.progress import LoggingProgress, watched
from orchestrator.images.template_build import ensure_template_image
from orchestrator.images.templates import BASE, TemplateCatalog
from orchestrator.images.worker import image_exists

__all__ = ["DockerImageSource"]

log = logging.getLogger(__name__)


class DockerImageSource:
    """Templates' images on one Docker engine; ``catalog`` is read at each build, so a reload of
    the templates is seen; ``base_image`` (the configured image) replaces the built worker."""

    def __init__(
        self,
        client: DockerClient,
        catalog: Callable[[], TemplateCatalog],
        *,
        base_image: str | None = None,
    ) -> None:
        self._client = client
        self._catalog = catalog
        self._base = base_image

    async def image_for(self, template: str) -> str:
        if template == BASE:
            if self._base is None:
                progress = watched(LoggingProgress(log, "worker image"))
                self._base = (await ensure_worker_image(self._client, progress=progress)).tag
            return self._base
        catalog = self._catalog()
        catalog.get(template)  # an unknown name says so before anything is built
        built = await ensure_template_image(
            self._client,
            catalog,
            template,
            base_tag=await self.image_for(BASE),
            progress=watched(LoggingProgress(log, f"template {template}")),
        )
        return built.tag

    async def check_image(self, reference: str) -> bool | None:
        return await image_exists(self._client, reference)
