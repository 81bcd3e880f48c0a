"""The template side of ``sandhold image``: building one (``build --template``), the list of
every template with what the engine has of it, and the current tags ``prune`` keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator._core import OrchestratorConfig

if TYPE_CHECKING:
    from orchestrator.images import BuildProgress
    from orchestrator.images.engine import ImageEngine
    from orchestrator.images.listing import TemplateRow
    from orchestrator.images.templates import TemplateCatalog

__all__ = ["build_template", "catalog", "current_template_tags", "describe_rows", "rows"]


def catalog(template_dirs: list[Path] | None) -> TemplateCatalog:
    """The shipped templates and the user's: ``--templates``, else ``SANDHOLD_TEMPLATES``, else
    ``<data dir>/templates``."""
    from orchestrator.images.templates import load_catalog

    config = OrchestratorConfig.from_env()
    dirs = tuple(template_dirs) if template_dirs else config.user_template_dirs()
    return load_catalog(dirs)


async def build_template(
    client: ImageEngine, name: str, base_tag: str, dirs: list[Path] | None, progress: BuildProgress
) -> str:
    from orchestrator.images.template_build import ensure_template_image

    built = await ensure_template_image(
        client, catalog(dirs), name, base_tag=base_tag, progress=progress
    )
    return built.tag


async def current_template_tags(client: ImageEngine, base_tag: str) -> list[str]:
    """Every template's current tag over ``base_tag``, built or not: what prune keeps."""
    from orchestrator.images.template_build import image_identity, template_hashes, template_tag
    from orchestrator.images.templates import BASE

    hashes = template_hashes(catalog(None), await image_identity(client, base_tag))
    return [template_tag(name, digest) for name, digest in hashes.items() if name != BASE]


async def rows(client: ImageEngine, base_tag: str, dirs: list[Path] | None) -> list[TemplateRow]:
    from orchestrator.images.listing import list_templates

    return await list_templates(client, catalog(dirs), base_tag=base_tag)


def describe_rows(found: list[TemplateRow]) -> list[list[str]]:
    """Cells of the list's table: name, kind, built, tag, size, age, from, description."""
    now = datetime.now(UTC)
    table = []
    for row in found:
        size = f"{row.size_bytes / 1e6:.0f} MB" if row.size_bytes is not None else "-"
        age = _age(now - row.created) if row.created is not None else "-"
        origin = row.parent or "-"
        kind = "shipped" if row.shipped else "user"
        built = "built" if row.built else "not built"
        table.append([row.name, kind, built, row.tag, size, age, origin, row.description])
    return table


def _age(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length}{unit}"
    return f"{max(seconds, 0)}s"
