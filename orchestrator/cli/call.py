"""``sandhold call``: one tool call against a running ``sandhold serve``, its structured result
printed.

Exit status: 0 when the tool succeeded; 1 when it answered a failure of the work (the user's
exception, a timeout, a blocked import: HTTP 200 with ``success: false``); 2 when the request
itself failed (a wrong argument, an unknown session, a policy refusal, a bad key, no server:
every non-200 answer and every transport error), shown as ``error: <code>: <message>``.

The client is ``orchestrator.client.ServerClient`` (the standard library's ``http.client``):
blocking, which suits a one-shot command; an async caller (``sandhold shell --server``) runs it
in a worker thread.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from orchestrator.cli._common import EXIT_ERROR, reported_errors, stdout
from orchestrator.client import (
    DEFAULT_URL,
    URL_VARIABLE,
    Answer,
    ServerClient,
    answer_timeout,
    url_from_env,
)
from orchestrator.errors import InvalidArgumentError

__all__ = ["ServerClient", "resolve_key", "server_from_env"]

# Fields shown as text blocks, in this order, rather than in the table of fields.
TEXT_FIELDS = ("stdout", "output", "result_repr", "content", "stderr", "traceback")
HEAD_FIELDS = frozenset({"success", "operation", "error_type", "error_message"})


def resolve_key(key: str | None) -> str:
    """``--key`` or ``SANDHOLD_API_KEY``, else the key ``sandhold serve`` keeps for its local
    tenant."""
    if key:
        return key
    from orchestrator._core import LOCAL_KEY_FILE, data_dir, local_key

    directory = data_dir()
    if not (directory / LOCAL_KEY_FILE).exists():  # never make a key a server does not know
        raise InvalidArgumentError(
            f"no API key: give --key or SANDHOLD_API_KEY (no local key in {directory})"
        )
    return local_key(directory)[0]


def server_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """``SANDHOLD_URL``, else the deprecated ``SANDHOLD_SERVER`` (with a warning on stderr)."""
    return url_from_env(_warn, environ)


def _warn(message: str) -> None:
    typer.echo(f"sandhold: {message} (the Sandbox API reads it too)", err=True)


def call(
    tool: Annotated[str, typer.Argument(help="Tool: python_repl, terminal, process, files, ...")],
    arguments: Annotated[
        str,
        typer.Argument(help="The tool's arguments as a JSON object, or - to read it from stdin."),
    ] = "{}",
    server: Annotated[
        str | None,
        typer.Option(
            help=f"URL of a running `sandhold serve` (default: ${URL_VARIABLE}, else "
            f"{DEFAULT_URL})."
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            envvar="SANDHOLD_API_KEY",
            help="API key (default: the local tenant's, from the data directory).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Make one tool call against a running `sandhold serve` and print its result, e.g.
    sandhold call python_repl '{"operation": "execute", "code": "6 * 7"}'"""
    with reported_errors():
        parsed = parse_arguments(sys.stdin.read() if arguments == "-" else arguments)
        client = ServerClient(server or server_from_env() or DEFAULT_URL, resolve_key(key))
        answer = client.call(tool, parsed, timeout=answer_timeout(parsed))
    raise typer.Exit(show(tool, answer, as_json=as_json))


def parse_arguments(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"the arguments are not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidArgumentError("the arguments must be a JSON object")
    return parsed


def show(tool: str, answer: Answer, *, as_json: bool) -> int:
    """Print an answer; the exit status it stands for."""
    result = answer.result
    if as_json:
        typer.echo(json.dumps(result, indent=2, ensure_ascii=False))
    if answer.request_failed:
        message = " ".join(str(result.get("error_message", "")).split())
        typer.echo(f"error: {result.get('error_type')}: {message}", err=True)
        return EXIT_ERROR
    if not as_json:
        render(tool, result)
    return 0 if result.get("success") else 1


def render(tool: str, result: dict[str, Any]) -> None:
    """A short readable rendering: a status line, the scalar fields, lists as tables, and the
    text fields (output, tracebacks) as they are."""
    ok = bool(result.get("success"))
    head = Text(f"{tool}.{result.get('operation')}: ", style="bold")
    head.append("ok" if ok else str(result.get("error_type")), style="green" if ok else "red")
    stdout.print(head)
    if result.get("error_message"):
        stdout.print(Text(str(result["error_message"]), style="red"))
    listings = {name: value for name, value in result.items() if _is_listing(value)}
    fields = Table.grid(padding=(0, 2))
    ids_first = sorted(result, key=lambda name: not name.endswith("_id"))
    for name in ids_first:
        value = result[name]
        if name in HEAD_FIELDS or name in TEXT_FIELDS or name in listings or value in (None, []):
            continue
        fields.add_row(Text(name, style="dim"), Text(_scalar(value)))
    if fields.row_count:
        stdout.print(fields)
    for name, rows in listings.items():
        stdout.print(_listing(name, rows))
    for name in TEXT_FIELDS:
        value = result.get(name)
        if isinstance(value, str) and value:
            stdout.print(Text(f"{name}:", style="dim"))
            stdout.print(Text(value.removesuffix("\n")))


def _is_listing(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _listing(name: str, rows: list[dict[str, Any]]) -> Table:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    table = Table(*columns, title=name, title_justify="left")
    for row in rows:
        table.add_row(*(Text(_scalar(row.get(column))) for column in columns))
    return table


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
