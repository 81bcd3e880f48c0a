"""``sandhold image prune``: worker and template images of earlier inputs
(``sandhold-worker:<hash>`` and ``sandhold-worker:<template>-<hash>`` tags other than the current
ones) removed, never one a container uses.

Each tag is decided on its own: the current tags (the worker image's, and each template's over
it) are kept; another tag of a current image is only a name, and is untagged (the image stays
under its current tag); a tag of an image that
any container (running, paused or stopped) was made from is kept, and said so; any other is
removed without force, so the engine refuses, and we report, a container made from it since
we looked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from orchestrator.backend.docker import DockerClient
from orchestrator.errors import OrchestratorError
from orchestrator.images.worker import WORKER_REPOSITORY

__all__ = ["PruneResult", "prune_worker_images"]


@dataclass
class PruneResult:
    removed: list[str] = field(default_factory=list)
    # Tag, and why it stays.
    kept: list[tuple[str, str]] = field(default_factory=list)


async def prune_worker_images(
    client: DockerClient,
    *,
    current: str,
    keep: Collection[str] = (),
    repository: str = WORKER_REPOSITORY,
    dry_run: bool = False,
) -> PruneResult:
    """Remove ``repository``'s tags other than ``current`` and those of ``keep`` (the current
    templates' tags, built or not) that no container's image has (``dry_run``: only say
    which)."""
    images = await client.call(lambda sdk: sdk.api.images(name=repository))
    current_tags = {current, *keep}
    current_ids = {
        image["Id"] for image in images if current_tags & set(image.get("RepoTags") or ())
    }
    current_ids.add((await client.call(lambda sdk: sdk.api.inspect_image(current)))["Id"])
    containers = await client.call(lambda sdk: sdk.api.containers(all=True))
    users = Counter(str(c.get("ImageID", "")) for c in containers)
    result = PruneResult()
    for image in images:
        for tag in sorted(image.get("RepoTags") or ()):
            if not tag.startswith(f"{repository}:") or tag in current_tags:
                continue
            if image["Id"] not in current_ids and users[image["Id"]]:
                result.kept.append((tag, f"{users[image['Id']]} container(s) use it"))
                continue
            if not dry_run:
                try:
                    await client.call(lambda sdk, tag=tag: sdk.api.remove_image(tag))
                except OrchestratorError as exc:
                    result.kept.append((tag, f"the engine refused: {exc}"))
                    continue
            result.removed.append(tag)
    return result
