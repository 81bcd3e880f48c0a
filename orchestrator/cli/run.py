"""``sbx run``: one-shot code in a throwaway sandbox."""

from __future__ import annotations

import secrets
import sys
from typing import Annotated

import anyio
import typer

from orchestrator.cli._common import reported_errors, stdout, until_terminated
from orchestrator.orchestrator import ExecuteResult, Orchestrator, OrchestratorConfig


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
        return await until_terminated(orchestrator.execute(code, policy=policy, timeout_s=timeout))
