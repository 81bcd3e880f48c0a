"""Snapshot images on Docker: a session container committed to an image, with the archive of its
tmpfs roots (which a commit does not capture) added at ``SNAPSHOT_FILES``.

A commit cannot add a file, and a session's root is read-only, so the archive goes in through a
never-started helper container (``put_archive``), committed under the snapshot's tag. The helper
is made from the container's own image when its root is read-only (its writable layer is then
empty: every session's), else from a first commit of the container, left untagged as the
snapshot's parent (removing the tag removes both). Every path that fails after something was
made removes it; the helper carries the caller's labels, so a sweep by label finds it after a
crash.
"""

from __future__ import annotations

import contextlib
import json
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator.backend.base import (
    LABEL_ORCHESTRATOR,
    LABEL_SESSION,
    SNAPSHOT_FILES,
    SnapshotImage,
)
from orchestrator.backend.docker._client import DockerClient, NotFoundError
from orchestrator.errors import BackendError

__all__ = ["commit_snapshot", "list_snapshot_images", "remove_snapshot_image"]

# The archive is readable by every user of a session made from the image (the sandbox user).
FILES_MODE = 0o444
# The helper is no session: the labels the reconcile finds sessions by, which it would inherit
# from an image made of a session, are blanked, so no reconcile takes it for an orphan.
NOT_A_SESSION = {LABEL_ORCHESTRATOR: "", LABEL_SESSION: ""}


def _label_changes(labels: Mapping[str, str]) -> list[str]:
    # Dockerfile LABEL syntax: keys and values JSON-quoted, so no value can add an instruction.
    return [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())]


def _wrapped(files: Path, into: Path) -> None:
    """A tar holding ``files`` at ``SNAPSHOT_FILES`` (relative to /), owned by root, read-only."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mode = FILES_MODE
        return info

    with tarfile.open(into, "w") as tar:
        tar.add(files, arcname=SNAPSHOT_FILES.lstrip("/"), filter=owned_by_root)


def _image_size(sdk: Any, ref: str) -> int:
    return int(sdk.api.inspect_image(ref).get("Size", 0))


def _commit_blocking(
    sdk: Any, container_id: str, reference: str, labels: Mapping[str, str], files: Path | None
) -> SnapshotImage:
    container = sdk.api.inspect_container(container_id)
    base = str(container.get("Image", ""))
    # A read-only root (every session's) leaves the writable layer empty: nothing to commit,
    # and a commit on a driver without a native diff (fuse-overlayfs) walks the whole image.
    read_only = bool((container.get("HostConfig") or {}).get("ReadonlyRootfs"))
    repository, _, tag = reference.partition(":")
    changes = _label_changes(labels)
    made: list[str] = []  # images to remove if a later step fails
    helper: str | None = None
    try:
        if files is None:
            sdk.api.commit(container_id, repository=repository, tag=tag, changes=changes)
        else:
            source = base
            if not read_only:
                source = str(sdk.api.commit(container_id, changes=changes)["Id"])
                made.append(source)
            helper = str(
                sdk.api.create_container(
                    image=source,
                    command=["true"],
                    labels={**labels, **NOT_A_SESSION},
                    network_disabled=True,
                )["Id"]
            )
            with tempfile.TemporaryDirectory(prefix="sandhold-snapshot-") as tmp:
                wrapper = Path(tmp) / "files.tar"
                _wrapped(files, wrapper)
                with wrapper.open("rb") as data:
                    if not sdk.api.put_archive(helper, "/", data):
                        raise BackendError("the engine refused the snapshot's archive")
            sdk.api.commit(helper, repository=repository, tag=tag, changes=changes)
        made.append(reference)
        size = _image_size(sdk, reference) - (_image_size(sdk, base) if base else 0)
    except BaseException:
        for image in reversed(made):
            with contextlib.suppress(Exception):
                sdk.api.remove_image(image)
        raise
    finally:
        if helper is not None:
            with contextlib.suppress(Exception):
                sdk.api.remove_container(helper, force=True)
    return SnapshotImage(reference, dict(labels), max(size, 0))


async def commit_snapshot(
    client: DockerClient,
    container_id: str,
    *,
    reference: str,
    labels: Mapping[str, str],
    files: Path | None,
) -> SnapshotImage:
    """The container committed under ``reference`` with ``labels`` and ``files``; nothing is
    left of a failed one. The work runs in one engine thread, shielded once begun (a thread
    cannot be cancelled, and its clean-up must run); each engine call in it is bounded by the
    client's API timeout."""
    with anyio.CancelScope(shield=True):
        image = await client.call(_commit_blocking, container_id, reference, labels, files)
    return image


async def remove_snapshot_image(client: DockerClient, reference: str) -> bool:
    """Remove the image without force: True once gone, False while a container uses it."""

    def remove(sdk: Any) -> bool:
        try:
            sdk.api.remove_image(reference)
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            if status == 404:
                return True
            if status == 409:  # a container (a session made from the snapshot) uses it
                return False
            raise
        return True

    try:
        return await client.call(remove)
    except NotFoundError:
        return True


async def list_snapshot_images(client: DockerClient, labels: Sequence[str]) -> list[SnapshotImage]:
    """Tagged images carrying every label filter, each with its whole size."""

    def listed(sdk: Any) -> list[SnapshotImage]:
        found = []
        for image in sdk.api.images(filters={"label": list(labels)}):
            for tag in image.get("RepoTags") or ():
                if tag and tag != "<none>:<none>":
                    found.append(
                        SnapshotImage(tag, dict(image.get("Labels") or {}), int(image["Size"]))
                    )
        return found

    return await client.call(listed)
