"""``sandhold image list``: every template with the tag its current inputs give, and whether
the engine has that image (its size and age when it does). Nothing is built or downloaded: the
tags come from the inputs hashes (``template_hashes``) over the worker image given."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.backend.docker import DockerClient, NotFoundError
from orchestrator.images.template_build import image_identity, template_hashes, template_tag
from orchestrator.images.templates import BASE, TemplateCatalog

__all__ = ["TemplateRow", "list_templates"]


@dataclass(frozen=True)
class TemplateRow:
    """One template as the list shows it; size and creation only when built."""

    name: str
    parent: str | None
    description: str
    tag: str
    built: bool
    shipped: bool
    size_bytes: int | None = None
    created: datetime | None = None


async def list_templates(
    client: DockerClient, catalog: TemplateCatalog, *, base_tag: str
) -> list[TemplateRow]:
    hashes = template_hashes(catalog, await image_identity(client, base_tag))
    rows = []
    for name in [BASE, *(n for n in catalog.names() if n != BASE)]:
        template = catalog.get(name)
        tag = base_tag if name == BASE else template_tag(name, hashes[name])
        size, created = await _image_facts(client, tag)
        rows.append(
            TemplateRow(
                name=name,
                parent=template.parent,
                description=template.description,
                tag=tag,
                built=size is not None,
                shipped=template.shipped,
                size_bytes=size,
                created=created,
            )
        )
    return rows


async def _image_facts(client: DockerClient, tag: str) -> tuple[int | None, datetime | None]:
    try:
        found = await client.call(lambda sdk: sdk.api.inspect_image(tag))
    except NotFoundError:
        return None, None
    created = str(found.get("Created", ""))
    try:
        # The engine writes nanoseconds; Python reads up to microseconds.
        when = datetime.fromisoformat(created[:26].rstrip("Z")).replace(tzinfo=UTC)
    except ValueError:
        when = None
    return int(found.get("Size") or 0), when
