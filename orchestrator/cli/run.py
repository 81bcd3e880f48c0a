"""``sandhold run``: one-shot code or command in a throwaway sandbox, its exit status passed
through."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer

from orchestrator.cli._common import EXIT_ERROR, reported_errors, until_terminated

if TYPE_CHECKING:
    from orchestrator._api import Orchestrator

__all__ = ["run"]


def run(
    code: Annotated[str | None, typer.Option("--code", help="Python code to run.")] = None,
    command: Annotated[
        str | None, typer.Option("--command", help="A shell command line to run.")
    ] = None,
    policy: Annotated[str | None, typer.Option(help="Name of the policy to run under.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds before it is stopped.")] = None,
    results_dir: Annotated[
        Path | None,
        typer.Option(
            "--results-dir",
            help="Where rich results (figures, HTML tables) are saved; a new temporary "
            "directory when not given.",
        ),
    ] = None,
) -> None:
    """Run code or a command in a throwaway sandbox. Output is printed, rich results are saved
    to files (their paths printed on stderr); the exit status is the command's, or 1 when the
    code failed."""
    if (code is None) == (command is None):
        typer.echo("error: invalid_argument: give exactly one of --code and --command", err=True)
        raise typer.Exit(EXIT_ERROR)
    with reported_errors():
        if code is not None:
            arguments = {
                "operation": "execute",
                "code": code,
                "policy": policy,
                "timeout_s": timeout,
            }
            result = anyio.run(_run_once, "python_repl", _given(arguments))
        else:
            result = anyio.run(
                _run_command, _given({"command": command, "policy": policy}), timeout
            )
    raise typer.Exit(_show(result, results_dir))


def _given(arguments: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in arguments.items() if value is not None}


def _orchestrator() -> Orchestrator:
    from orchestrator._api import Orchestrator, OrchestratorConfig

    return Orchestrator(
        OrchestratorConfig.from_env(
            orchestrator_id=f"sandhold-run-{secrets.token_hex(4)}"
        ).side_by_side("run", adopt=False)
    )


async def _run_once(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async with _orchestrator() as orchestrator, _showing_builds():
        result = await until_terminated(orchestrator.call(tool, arguments))
        return result.structured


@contextlib.asynccontextmanager
async def _showing_builds() -> AsyncIterator[None]:
    """An image the call builds first (a template's on its first use) shows its steps on
    stderr, a live display on a terminal, as ``sandhold image build`` shows them."""
    from orchestrator.cli.image import build_progress
    from orchestrator.images.progress import watching_builds

    with build_progress() as progress, watching_builds(progress):
        yield


async def _run_command(arguments: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """A terminal with pipes (a plain ``bash -c``), its output streamed as it comes; stdout and
    stderr arrive together, in order, as they do in a terminal."""
    async with _orchestrator() as orchestrator:

        async def until_exit() -> dict[str, Any]:
            start = {"operation": "start", "use_pty": False, "yield_time_ms": 0, **arguments}
            async with _showing_builds():  # only while the session is made: output follows
                result = (await orchestrator.call("terminal", start)).structured
            while result["success"]:
                sys.stdout.write(result.get("output", ""))
                sys.stdout.flush()
                if result["state"] != "running":
                    return result | {"output": ""}
                wait = {
                    "operation": "wait",
                    "terminal_id": result["terminal_id"],
                    "since_offset": result["next_offset"],
                    "timeout_ms": 10_000,
                }
                result = (await orchestrator.call("terminal", wait)).structured
            return result

        try:
            with anyio.fail_after(timeout) if timeout else contextlib.nullcontext():
                return await until_terminated(until_exit())
        except TimeoutError:
            message = f"the command did not finish within {timeout:g} s"
            return {"success": False, "error_type": "timeout", "error_message": message}


# The file each representation of a rich result is saved as, by preference; text/plain is
# printed instead when a result has nothing else.
_SUFFIXES = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/svg+xml": ".svg",
    "text/html": ".html",
    "text/markdown": ".md",
    "text/latex": ".tex",
    "application/json": ".json",
}
_BINARY = frozenset({"image/png", "image/jpeg"})


def _save_results(results: list[dict[str, Any]], directory: Path | None) -> None:
    """Each representation of each rich result as a file; text-only results other than the
    main one (``display(3)``) are printed, as a notebook shows them."""
    for number, bundle in enumerate(results, 1):
        kinds = [mime for mime in _SUFFIXES if mime in bundle]
        if not kinds:
            if not bundle.get("is_main_result"):  # the main one is result_repr, printed below
                sys.stdout.write(f"{bundle.get('text/plain', '')}\n")
            continue
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="sandhold-results-"))
        directory.mkdir(parents=True, exist_ok=True)
        for mime in kinds:
            path = directory / f"result-{number}{_SUFFIXES[mime]}"
            data = bundle[mime]
            if mime in _BINARY:
                path.write_bytes(base64.b64decode(data))
            elif mime == "application/json":
                path.write_text(json.dumps(data, indent=2), encoding="utf-8")
            else:
                path.write_text(str(data), encoding="utf-8")
            sys.stderr.write(f"result {number} ({mime}) saved to {path}\n")


def _show(result: dict[str, Any], results_dir: Path | None = None) -> int:
    """Print a result as a terminal user expects it; the exit status to pass on."""
    sys.stdout.write(result.get("stdout") or "")
    sys.stderr.write(result.get("stderr") or "")
    _save_results(result.get("results") or [], results_dir)
    if result.get("result_repr") is not None:
        sys.stdout.write(f"{result['result_repr']}\n")
    if isinstance(result.get("exit_code"), int) and not result.get("timed_out"):
        return int(result["exit_code"])
    if result["success"]:
        return 0
    sys.stderr.write(f"{result.get('error_type')}: {result.get('error_message')}\n")
    if result.get("traceback"):
        sys.stderr.write(str(result["traceback"]).rstrip() + "\n")
    if result.get("error_type") == "timeout":
        return EXIT_TIMEOUT
    return EXIT_ERROR if result.get("error_type") in _SANDHOLD_ERRORS else 1


# As coreutils' timeout(1) exits when the command ran out of time.
EXIT_TIMEOUT = 124
# Failures of sandhold itself (as opposed to the user's code) exit like every other sandhold error.
_SANDHOLD_ERRORS = frozenset(
    {
        "invalid_argument",
        "session_not_found",
        "session_lost",
        "quota_exceeded",
        "policy",
        "busy",
        "backend_unavailable",
        "not_supported",
        "storage_full",
        "internal",
    }
)
