"""``sandhold image build``: the sandbox images, with a progress display; ``sandhold image
prune``: worker images of earlier inputs removed, never the current one or one a container
uses."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from orchestrator.cli._common import reported_errors, stderr, stdout, until_terminated

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from orchestrator._core import OrchestratorConfig
    from orchestrator.images import BuildProgress, ImageBuildResult
    from orchestrator.images.listing import TemplateRow
    from orchestrator.images.prune import PruneResult

__all__ = ["build_progress", "with_image"]

# A log line wider than this would wrap and make the live display jump.
MAX_LOG_CHARS = 90

image_app = typer.Typer(help="Build and prune the sandbox images.", no_args_is_help=True)


class RichBuildProgress:
    """Shows each build step as a spinner line carrying the step's latest log line."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}
        self._current: TaskID | None = None

    def step(self, name: str) -> None:
        self._current = self._progress.add_task(name, total=1, last="")
        self._tasks[name] = self._current

    def log(self, line: str) -> None:
        if self._current is not None:
            text = line if len(line) <= MAX_LOG_CHARS else line[: MAX_LOG_CHARS - 1] + "…"
            self._progress.update(self._current, last=text)

    def done(self, name: str) -> None:
        task = self._tasks.get(name)
        if task is not None:
            self._progress.update(task, completed=1)


@image_app.command("build")
def image_build(
    base_image: Annotated[
        str | None,
        typer.Option(
            help="Base image to build on: used if local, else pulled, else the Debian base "
            "is built instead (default: env SANDHOLD_BASE_IMAGE, then BASE_IMAGE)."
        ),
    ] = None,
    suite: Annotated[
        str | None,
        typer.Option(help="Debian suite for the debootstrapped base (default: this host's)."),
    ] = None,
    template: Annotated[
        str,
        typer.Option(
            help="The template to build: base (the worker image), python-data, or "
            "one of the template directories."
        ),
    ] = "base",
    templates: Annotated[
        list[Path] | None,
        typer.Option(
            help="A folder of user templates (NAME.toml); repeatable (default: env "
            "SANDHOLD_TEMPLATES, then <data dir>/templates)."
        ),
    ] = None,
) -> None:
    """Build the worker image (and its base when needed), or a template on top of it; prints
    the image tag."""
    with reported_errors(), build_progress() as progress:
        result = anyio.run(_ensure_image, base_image, suite, progress)
        tag = result.tag
        if template != "base":
            tag = anyio.run(_ensure_template, template, tag, templates, progress)
    stdout.print(tag, markup=False)


@image_app.command("list")
def image_list(
    templates: Annotated[
        list[Path] | None,
        typer.Option(
            help="A folder of user templates (NAME.toml); repeatable (default: env "
            "SANDHOLD_TEMPLATES, then <data dir>/templates)."
        ),
    ] = None,
) -> None:
    """Every template, built or not, with its current tag, size and age (the worker image,
    SANDHOLD_IMAGE or the one `image build` makes, is built first if missing)."""
    from rich.table import Table

    from orchestrator.cli._image_templates import describe_rows

    with reported_errors():
        found = anyio.run(_template_rows, templates)
    table = Table("template", "kind", "state", "tag", "size", "age", "from", "description")
    for cells in describe_rows(found):
        table.add_row(*cells)
    stdout.print(table)


@image_app.command("prune")
def image_prune(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only print what would be removed.")
    ] = False,
) -> None:
    """Remove sandhold-worker images other than the current one (SANDHOLD_IMAGE, else the one
    `image build` makes, built first if missing), keeping any a container uses."""
    with reported_errors():
        result = anyio.run(_prune, dry_run)
    verb = "would remove" if dry_run else "removed"
    for tag in result.removed:
        stdout.print(f"{verb} {tag}", markup=False)
    for tag, reason in result.kept:
        stdout.print(f"kept {tag}: {reason}", markup=False)
    if not result.removed and not result.kept:
        stdout.print("nothing to prune", markup=False)


async def _prune(dry_run: bool) -> PruneResult:
    from orchestrator.cli._image_templates import current_template_tags
    from orchestrator.images import ensure_worker_image
    from orchestrator.images.engine import open_image_engine
    from orchestrator.images.prune import prune_worker_images

    current = os.environ.get("SANDHOLD_IMAGE")
    client = open_image_engine()
    try:
        if current is None:
            built = await ensure_worker_image(client, progress=PlainBuildProgress())
            current = built.tag
        keep = await current_template_tags(client, current)
        return await prune_worker_images(client, current=current, keep=keep, dry_run=dry_run)
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()


@contextlib.contextmanager
def build_progress() -> Iterator[BuildProgress]:
    """A live display on a terminal; one line per finished step in a log (CI, a pipe)."""
    if not stderr.is_terminal:
        yield PlainBuildProgress()
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(finished_text="[green]✓[/]"),
        TextColumn("{task.description:<16}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}", markup=False, style="dim"),
    )
    with Progress(*columns, console=stderr, transient=False) as progress:
        yield RichBuildProgress(progress)


class PlainBuildProgress:
    """Prints each finished step with its last log line, for output that is not a terminal."""

    def __init__(self) -> None:
        self._last = ""

    def step(self, name: str) -> None:
        self._last = ""

    def log(self, line: str) -> None:
        self._last = line

    def done(self, name: str) -> None:
        typer.echo(f"{name}: {self._last}" if self._last else name, err=True)


async def _ensure_image(
    base_image: str | None, suite: str | None, progress: BuildProgress
) -> ImageBuildResult:
    from orchestrator.images import ensure_worker_image
    from orchestrator.images.engine import open_image_engine

    client = open_image_engine()
    try:
        return await until_terminated(
            ensure_worker_image(client, base_image=base_image, suite=suite, progress=progress)
        )
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()


async def _ensure_template(
    name: str, base_tag: str, dirs: list[Path] | None, progress: BuildProgress
) -> str:
    from orchestrator.cli._image_templates import build_template
    from orchestrator.images.engine import open_image_engine

    client = open_image_engine()
    try:
        return await until_terminated(build_template(client, name, base_tag, dirs, progress))
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()


async def _template_rows(dirs: list[Path] | None) -> list[TemplateRow]:
    from orchestrator.cli._image_templates import rows
    from orchestrator.images import ensure_worker_image
    from orchestrator.images.engine import open_image_engine

    client = open_image_engine()
    try:
        base = os.environ.get("SANDHOLD_IMAGE")
        if base is None:
            base = (await ensure_worker_image(client, progress=PlainBuildProgress())).tag
        return await rows(client, base, dirs)
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()


async def with_image(config: OrchestratorConfig) -> OrchestratorConfig:
    """The config with its image, built here when missing so its progress shows on stderr
    (for commands whose stdout is not for people: mcp, serve, shell). Only Docker's engine
    builds one: any other takes the image its nodes hold (``SANDHOLD_IMAGE``)."""
    if config.image is not None or config.backend.name != "docker":
        return config
    from orchestrator.images import ensure_worker_image
    from orchestrator.images.engine import open_image_engine

    client = open_image_engine()
    try:
        built = await ensure_worker_image(client, progress=PlainBuildProgress())
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()
    return dataclasses.replace(config, image=built.tag)
