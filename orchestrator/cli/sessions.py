"""``sandhold ps`` and ``sandhold kill``: the sandboxes on this engine, for ops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from orchestrator.cli._common import reported_errors, stdout

if TYPE_CHECKING:
    from orchestrator.registry.fleet import FleetEntry

__all__ = ["kill", "ps"]

# Stats asked of the engine at once by ``ps`` (each is a wait in dockerd, not work here).
PS_STATS_CONCURRENCY = 128


def ps(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    registry: Annotated[
        Path | None,
        typer.Option(
            envvar="SANDHOLD_REGISTRY",
            help="A registry naming the sessions' owners (read-only; default: the one in the "
            "data directory, if any).",
        ),
    ] = None,
) -> None:
    """List every sandhold session container on this engine: owner, policy, age, memory."""
    from rich.table import Table

    from orchestrator._core import data_dir
    from orchestrator.registry.store import read_owners

    with reported_errors():
        owners = read_owners(registry or data_dir() / "registry.db")
        entries = anyio.run(_with_backend_list, owners)
    if as_json:
        stdout.print(json.dumps([e.to_dict() for e in entries], indent=2), markup=False)
        return
    table = Table("SESSION", "TENANT", "TASK", "POLICY", "STATE", "AGE", "MEMORY", "ORCHESTRATOR")
    for e in entries:
        memory = "-" if e.memory_mb is None else f"{e.memory_mb:.1f} MiB"
        table.add_row(
            e.session_id,
            e.tenant,
            e.task or "-",
            e.policy,
            e.state,
            _age(e.age_s),
            memory,
            e.orchestrator_id,
        )
    stdout.print(table)


def kill(
    session_id: Annotated[str, typer.Argument(help="The session to end (from `sandhold ps`).")],
) -> None:
    """End one session by removing its container."""
    with reported_errors():
        removed = anyio.run(_with_backend_kill, session_id)
    stdout.print(f"removed {removed} container(s) of session {session_id}", markup=False)


async def _with_backend_list(owners: dict[str, tuple[str, str | None]]) -> list[FleetEntry]:
    from orchestrator._core import open_backend
    from orchestrator.registry.fleet import list_fleet

    # Docker 20.10 answers a one-shot stats at its collector's next tick, about a second: asked
    # all at once, a hundred containers cost one tick rather than one per 16.
    backend = open_backend(stats_concurrency=PS_STATS_CONCURRENCY)
    try:
        return await list_fleet(backend, owners=owners)
    finally:
        await backend.aclose()


async def _with_backend_kill(session_id: str) -> int:
    from orchestrator._core import open_backend
    from orchestrator.registry.fleet import kill_session

    backend = open_backend()
    try:
        return await kill_session(backend, session_id)
    finally:
        await backend.aclose()


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
