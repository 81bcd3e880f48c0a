"""Building a template's image on top of its parent: ``sandhold-worker:<template>-<hash>``.

The hash covers every input: the Dockerfile (ours with the template's environment, or the
user's), the pins of the lock and of the pip that installs them, the context files of a user
Dockerfile, and the parent's own inputs hash, so a new worker image or a new parent gives every
template below it a new tag, and a tag that exists is current. The hash is known before
anything is downloaded: wheels are fetched only for an image that must be built. Builds run
with the network off, one per image on this host at a time (the build lock).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import anyio

from orchestrator._resources import shipped_templates_dir, template_dockerfile
from orchestrator.backend.docker import DockerClient, NotFoundError
from orchestrator.errors import ImageError, TemplateFileError
from orchestrator.images._cache import build_lock
from orchestrator.images._engine_build import build_blocking
from orchestrator.images.lockfile import Pin, lock_digest, parse_lock, render_lock
from orchestrator.images.progress import ONE_TIME_BUILD, BuildProgress
from orchestrator.images.template_debs import DEBS_DOCKERFILE, fetch_template_debs
from orchestrator.images.template_wheels import fetch_template_wheels, probe_target
from orchestrator.images.templates import (
    BASE,
    MAX_CONTEXT_BYTES,
    MAX_CONTEXT_FILES,
    PARENT_ARG,
    Template,
    TemplateCatalog,
)
from orchestrator.images.worker import (
    LABEL_IMAGE_INPUTS,
    TAG_HASH_CHARS,
    WORKER_REPOSITORY,
    image_is_current,
)

__all__ = [
    "LABEL_TEMPLATE",
    "TemplateImage",
    "ensure_template_image",
    "first_use_notice",
    "image_identity",
    "template_hashes",
    "template_tag",
]

LABEL_TEMPLATE = "sandhold.template"
# pip installing ~100 MB of wheels and compiling them, on 2 slow cores.
TEMPLATE_BUILD_TIMEOUT = 1800.0
TEMPLATE_LOCK_TIMEOUT = TEMPLATE_BUILD_TIMEOUT + 60.0
ENV_MARKER = "#ENV-LINES"
# What a first use is told before a template's one-time build: python-data (13 pins, ~100 MB
# of wheels) took 85 s on 2 cores with nothing cached (issue 32), 6.5 s a pin; a Dockerfile
# template is at least a container's build.
BUILD_SECONDS_PER_PIN = 6.5
MIN_BUILD_ESTIMATE_S = 15.0
STEP_PARENT = "parent image"
STEP_WHEELS = "template wheels"
STEP_IMAGE = "template image"
STEP_DEBS = "template Debian packages"


@dataclass(frozen=True)
class TemplateImage:
    """A template's image: its tag, its inputs hash, and whether this call built it."""

    template: str
    tag: str
    inputs_hash: str
    built: bool


def template_tag(name: str, inputs_hash: str) -> str:
    return f"{WORKER_REPOSITORY}:{name}-{inputs_hash[:TAG_HASH_CHARS]}"


def pip_pins() -> tuple[Pin, ...]:
    """The pip that installs wheels inside a build, pinned like any other wheel."""
    return parse_lock((shipped_templates_dir() / "pip.lock").read_text(encoding="utf-8"))


async def image_identity(client: DockerClient, ref: str) -> str:
    """What a child's hash covers of ``ref``: its inputs hash when sandhold built it, else the
    engine's id of it (an image given by the configuration)."""
    try:
        image = await client.call(lambda sdk: sdk.images.get(ref))
    except NotFoundError:
        raise ImageError(f"no image {ref!r} on the engine") from None
    labels = image.labels or {}
    return str(labels.get(LABEL_IMAGE_INPUTS) or image.id)


def dockerfile_of(template: Template) -> bytes:
    """The Dockerfile a template builds with: the user's, or ours with its ``[env]``."""
    if template.dockerfile is not None:
        return template.dockerfile
    text = DEBS_DOCKERFILE if template.debs else template_dockerfile().read_text(encoding="utf-8")
    lines = "\n".join(f"ENV {key}={value}" for key, value in template.env.items())
    return text.replace(ENV_MARKER, lines or "# (none)").encode()


def context_files(template: Template) -> list[tuple[str, bytes]]:
    """A user Dockerfile's build context as (relative path, bytes), sorted, bounded."""
    if template.context is None:
        return []
    found, total = [], 0
    for path in sorted(template.context.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        total += len(data)
        found.append((path.relative_to(template.context).as_posix(), data))
        if len(found) > MAX_CONTEXT_FILES or total > MAX_CONTEXT_BYTES:
            raise TemplateFileError(
                str(template.source), "context",
                f"more than {MAX_CONTEXT_FILES} files or {MAX_CONTEXT_BYTES >> 20} MiB",
            )  # fmt: skip
    return found


def inputs_hash(
    template: Template, parent_hash: str, *, dockerfile: bytes, files: Iterable[tuple[str, bytes]]
) -> str:
    """sha256 over every input of the template's image, each length-prefixed."""
    digest = hashlib.sha256()

    def part(kind: bytes, data: bytes) -> None:
        digest.update(kind + len(data).to_bytes(8, "big") + data)

    part(b"template", template.name.encode())
    part(b"parent", parent_hash.encode())
    part(b"dockerfile", dockerfile)
    if template.debs:
        part(b"debs", " ".join(template.debs).encode())
    if template.pins:
        part(b"pins", lock_digest(template.pins).encode())
        part(b"pip", lock_digest(pip_pins()).encode())
    for name, data in sorted(files):
        part(b"context-path", name.encode())
        part(b"context-file", data)
    return digest.hexdigest()


def template_hashes(catalog: TemplateCatalog, base_hash: str) -> dict[str, str]:
    """Every template's inputs hash over a worker image of ``base_hash`` (``base`` included):
    what ``image prune`` keeps, without building or downloading anything."""
    hashes = {BASE: base_hash}

    def resolve(name: str) -> str:
        if name not in hashes:
            template = catalog.get(name)
            assert template.parent is not None  # only base has none
            hashes[name] = inputs_hash(
                template,
                resolve(template.parent),
                dockerfile=dockerfile_of(template),
                files=context_files(template),
            )
        return hashes[name]

    for name in catalog.names():
        resolve(name)
    return hashes


async def ensure_template_image(
    client: DockerClient,
    catalog: TemplateCatalog,
    name: str,
    *,
    base_tag: str,
    progress: BuildProgress,
) -> TemplateImage:
    """The current image of template ``name`` over the worker image ``base_tag``, built (with
    its parents, nearest last) where missing."""
    chain = list(reversed(catalog.chain(name)))
    parent = TemplateImage(BASE, base_tag, await image_identity(client, base_tag), built=False)
    for template in chain[1:]:
        parent = await _ensure_one(client, template, parent, progress)
    return parent


async def _ensure_one(
    client: DockerClient, template: Template, parent: TemplateImage, progress: BuildProgress
) -> TemplateImage:
    dockerfile = dockerfile_of(template)
    files = await anyio.to_thread.run_sync(context_files, template)
    digest = inputs_hash(template, parent.inputs_hash, dockerfile=dockerfile, files=files)
    tag = template_tag(template.name, digest)
    if await image_is_current(client, tag, digest):
        progress.log(f"{tag} is current")
        return TemplateImage(template.name, tag, digest, built=False)
    async with build_lock(
        f"template-{digest[:16]}", timeout=TEMPLATE_LOCK_TIMEOUT, progress=progress
    ):
        if await image_is_current(client, tag, digest):
            return TemplateImage(template.name, tag, digest, built=False)
        announce = first_use_notice(template)
        progress.step(announce)
        progress.done(announce)
        await _build(client, template, parent, tag, digest, dockerfile, files, progress)
    progress.log(f"{tag} built")
    return TemplateImage(template.name, tag, digest, built=True)


async def _build(
    client: DockerClient,
    template: Template,
    parent: TemplateImage,
    tag: str,
    digest: str,
    dockerfile: bytes,
    files: list[tuple[str, bytes]],
    progress: BuildProgress,
) -> None:
    wheels: list[Path] = []
    debs: list[Path] = []
    if template.debs:
        progress.step(STEP_DEBS)
        debs = await fetch_template_debs(client, parent.tag, template.debs, progress=progress)
        progress.done(STEP_DEBS)
    if template.pins:
        progress.step(STEP_PARENT)
        parent_id = str((await client.call(lambda sdk: sdk.images.get(parent.tag))).id)
        target = await probe_target(client, parent_id)
        progress.log(f"Python {target.version} on {target.machine} (glibc {target.glibc_minor})")
        progress.done(STEP_PARENT)
        progress.step(STEP_WHEELS)
        wheels = await fetch_template_wheels(_with_pip(template), target, progress=progress)
        progress.done(STEP_WHEELS)
    progress.step(STEP_IMAGE)
    labels = {LABEL_IMAGE_INPUTS: digest, LABEL_TEMPLATE: template.name}
    buildargs = {
        "PARENT_IMAGE": parent.tag,
        PARENT_ARG: parent.tag,
        "TEMPLATE_NAME": template.name,
        "CHECK_MODULES": " ".join(template.preload),
    }

    def write(context: Path) -> None:
        _write_context(context, template, dockerfile, files, wheels)
        (context / "debs").mkdir()
        for deb in debs:
            shutil.copyfile(deb, context / "debs" / deb.name)

    await client.call(_build_in_context, write, tag, buildargs, labels, progress)
    if not await image_is_current(client, tag, digest):
        raise ImageError(f"the build of {tag} ended without producing it")
    progress.done(STEP_IMAGE)


def first_use_notice(template: Template) -> str:
    """What is said before a template's image is built: that it happens once, and how long."""
    seconds = max(MIN_BUILD_ESTIMATE_S, BUILD_SECONDS_PER_PIN * len(template.pins))
    about = f"{seconds / 60:.1f} min" if seconds >= 60 else f"{round(seconds, -1):.0f} s"
    return (
        f"{ONE_TIME_BUILD} of template {template.name}: about {about}; later sessions start at once"
    )


def _with_pip(template: Template) -> tuple[Pin, ...]:
    """The template's pins and the build's pip. A template may install pip itself (the shipped
    ``pip`` template does) only as the build pins it: one wheel is then both the installer and
    installed, and no second pip can shadow the one whose hash the build checks."""
    build = pip_pins()
    mine = tuple(pin for pin in template.pins if pin.name == "pip")
    if mine and mine != build:
        raise TemplateFileError(
            str(template.source), "pip",
            "pip is the build's own: a template may pin it only as images/templates/pip.lock "
            f"does ({', '.join(f'{p.name}=={p.version}' for p in build)}, same hashes)",
        )  # fmt: skip
    return template.pins if mine else (*template.pins, *build)


def _build_in_context(
    sdk: object,
    write: Callable[[Path], None],
    tag: str,
    buildargs: dict[str, str],
    labels: dict[str, str],
    progress: BuildProgress,
) -> None:
    context = Path(tempfile.mkdtemp(prefix="sandhold-template-context-"))
    try:
        write(context)
        build_blocking(
            sdk,
            context=context,
            tag=tag,
            buildargs=buildargs,
            labels=labels,
            progress=progress,
            timeout=TEMPLATE_BUILD_TIMEOUT,
        )
    finally:
        shutil.rmtree(context, ignore_errors=True)


def _write_context(
    context: Path,
    template: Template,
    dockerfile: bytes,
    files: list[tuple[str, bytes]],
    wheels: list[Path],
) -> None:
    for name, data in files:
        target = context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (context / "Dockerfile").write_bytes(dockerfile)
    if template.pins:
        (context / "wheels").mkdir()
        for wheel in wheels:
            # Hard links where the cache shares the file system, copies elsewhere: 100 MB.
            try:
                os.link(wheel, context / "wheels" / wheel.name)
            except OSError:
                shutil.copyfile(wheel, context / "wheels" / wheel.name)
        (context / "requirements.lock").write_text(render_lock(template.pins))
