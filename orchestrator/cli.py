"""``sbx``: the command line. Presentation only: every command calls the library and shows what
it returns; an sbx error becomes one line ``error: <code>: <message>`` and exit status 2."""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import sys
from collections.abc import Awaitable, Iterator
from typing import Annotated, Any, TypeVar

import anyio
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from orchestrator.backend.docker._client import DockerClient
from orchestrator.errors import OrchestratorError
from orchestrator.images import BuildProgress, ImageBuildResult, ensure_worker_image
from orchestrator.orchestrator import ExecuteResult, Orchestrator, OrchestratorConfig
from orchestrator.policy import Policy, load_policy

T = TypeVar("T")

# Exit status for an error sbx reports (typer uses 2 for usage errors too: both mean "not done").
EXIT_ERROR = 2
# A log line wider than this would wrap and make the live display jump.
MAX_LOG_CHARS = 90

app = typer.Typer(
    name="sbx",
    help="Container-isolated Python sandboxes.",
    no_args_is_help=True,
    add_completion=False,
)
image_app = typer.Typer(help="Build the sandbox images.", no_args_is_help=True)
policy_app = typer.Typer(help="Inspect and check policies.", no_args_is_help=True)
app.add_typer(image_app, name="image")
app.add_typer(policy_app, name="policy")

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False)


@contextlib.contextmanager
def reported_errors() -> Iterator[None]:
    """Show an sbx error as one line with its stable code, and exit with ``EXIT_ERROR``."""
    try:
        yield
    except OrchestratorError as err:
        message = " ".join(str(err).split())
        typer.echo(f"error: {err.code}: {message}", err=True)
        raise typer.Exit(EXIT_ERROR) from None


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
            "is built instead (default: env SBX_BASE_IMAGE, then BASE_IMAGE)."
        ),
    ] = None,
    suite: Annotated[
        str | None,
        typer.Option(help="Debian suite for the debootstrapped base (default: this host's)."),
    ] = None,
) -> None:
    """Build the worker image (and its base when needed); prints the image tag."""
    with reported_errors(), _build_progress() as progress:
        result = anyio.run(_ensure_image, base_image, suite, progress)
    stdout.print(result.tag, markup=False)


@contextlib.contextmanager
def _build_progress() -> Iterator[BuildProgress]:
    """A live display on a terminal; one line per finished step in a log (CI, a pipe)."""
    if not stderr.is_terminal:
        yield PlainBuildProgress()
        return
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
    client = DockerClient()
    try:
        return await _until_terminated(
            ensure_worker_image(client, base_image=base_image, suite=suite, progress=progress)
        )
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()


async def _until_terminated(work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it on SIGTERM or SIGHUP as asyncio already does on SIGINT, so
    its cleanup (stopping debootstrap, removing temporary trees) runs; then KeyboardInterrupt."""
    outcome: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:
        group.start_soon(_cancel_on_termination, group.cancel_scope)
        try:
            outcome.append(await work)
        except Exception as exc:  # re-raised below, outside the task group's exception group
            failure.append(exc)
        group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if not outcome:
        raise KeyboardInterrupt
    return outcome[0]


async def _cancel_on_termination(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            scope.cancel()
            return


@app.command("run")
def run(
    code: Annotated[str, typer.Option("--code", help="Python code to run.")],
    policy: Annotated[str | None, typer.Option(help="Policy name or file.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds before it is stopped.")] = None,
) -> None:
    """Run code in a throwaway sandbox; its output is printed and its failure is the exit status."""
    with reported_errors():
        result = anyio.run(_run_once, code, policy, timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.result_repr is not None:
        stdout.print(result.result_repr, markup=False)
    if not result.success:
        typer.echo(f"{result.error_type}: {result.error_message}", err=True)
        if result.traceback:
            typer.echo(result.traceback.rstrip(), err=True)
        raise typer.Exit(1)


async def _run_once(code: str, policy: str | None, timeout: float | None) -> ExecuteResult:
    config = OrchestratorConfig(orchestrator_id=f"sbx-run-{secrets.token_hex(4)}")
    async with Orchestrator(config) as orchestrator:
        return await _until_terminated(orchestrator.execute(code, policy=policy, timeout_s=timeout))


@policy_app.command("check")
def policy_check(
    policy: Annotated[str, typer.Argument(help="A shipped policy name or a policy file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Validate a policy and print the effective settings and their hash."""
    with reported_errors():
        loaded = load_policy(policy)
    if as_json:
        document = {"name": loaded.name, "hash": loaded.hash, "policy": _effective(loaded)}
        stdout.print(json.dumps(document, indent=2), markup=False)
    else:
        stdout.print("\n".join(_toml_lines(loaded)), markup=False)


def _effective(policy: Policy) -> dict[str, Any]:
    return policy.model_dump(mode="json", exclude={"extends"})


def _toml_lines(policy: Policy) -> list[str]:
    # JSON scalars and arrays are valid TOML values; unset (None) settings are left out.
    data = _effective(policy)
    lines = [f"# effective policy {policy.name!r}", f"# hash = {policy.hash}"]
    tables = {key: value for key, value in data.items() if isinstance(value, dict)}
    lines += [
        f"{k} = {json.dumps(v)}" for k, v in data.items() if k not in tables and v is not None
    ]
    for name, table in tables.items():
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items() if v is not None]
    return lines


def main() -> None:
    """Console script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
