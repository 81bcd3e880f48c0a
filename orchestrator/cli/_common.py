"""Shared pieces of the ``sandhold`` commands: one-line errors with their stable code and exit
status 2, the consoles, and cancelling work on SIGTERM or SIGHUP."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Awaitable, Iterator
from typing import NoReturn, TypeVar

import anyio
import typer
from rich.console import Console

from orchestrator.errors import OrchestratorError

T = TypeVar("T")

# Exit status for an error sandhold reports (typer uses 2 for usage errors too: both mean "not
# done").
EXIT_ERROR = 2

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False)


@contextlib.contextmanager
def reported_errors() -> Iterator[None]:
    """Show an sandhold error as one line with its stable code, and exit with ``EXIT_ERROR``."""
    try:
        yield
    except OrchestratorError as err:
        _report(err)
    except BaseExceptionGroup as group:
        # A task group around the failing step (serve's signal handling) wraps the error.
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if not isinstance(leaf, OrchestratorError):
            raise
        _report(leaf)


def _report(err: OrchestratorError) -> NoReturn:
    message = " ".join(str(err).split())
    typer.echo(f"error: {err.code}: {message}", err=True)
    raise typer.Exit(EXIT_ERROR) from None


async def until_terminated(work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it on SIGTERM or SIGHUP as asyncio already does on SIGINT, so
    its cleanup (stopping debootstrap, removing temporary trees) runs; then KeyboardInterrupt."""
    outcome: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:
        group.start_soon(cancel_on_termination, group.cancel_scope)
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


async def cancel_on_termination(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            scope.cancel()
            return
