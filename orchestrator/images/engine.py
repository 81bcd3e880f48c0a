"""The engine images are built on: Docker's, the one engine that builds images here. ``sandhold
image``'s commands open it through this module, so that above ``backend/`` only the engine seam
(``_core/engines.py``) and ``images/`` name Docker (``tests/unit/test_layers.py``)."""

from __future__ import annotations

from typing import TypeAlias

from orchestrator.backend.docker import DockerClient

__all__ = ["ImageEngine", "open_image_engine"]

# What every builder, lister and pruner in ``images/`` is handed.
ImageEngine: TypeAlias = DockerClient


def open_image_engine() -> ImageEngine:
    """A connection to the engine, as its environment says (``DOCKER_HOST``); nothing is asked
    of it yet."""
    return DockerClient()
