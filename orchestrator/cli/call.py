"""``sandhold call``: one tool call against a running ``sandhold serve``, its structured result
printed.

Exit status: 0 when the tool succeeded; 1 when it answered a failure of the work (the user's
exception, a timeout, a blocked import: HTTP 200 with ``success: false``); 2 when the request
itself failed (a wrong argument, an unknown session, a policy refusal, a bad key, no server:
every non-200 answer and every transport error), shown as ``error: <code>: <message>``.

The client is the standard library's ``urllib``: blocking, which suits a one-shot command; an
async caller (``sandhold shell --server``) runs it in a worker thread.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from orchestrator.cli._common import EXIT_ERROR, reported_errors, stdout
from orchestrator.errors import BackendUnavailableError, InvalidArgumentError, OrchestratorError

__all__ = ["ServerClient", "resolve_key", "server_from_env"]

DEFAULT_SERVER = "http://127.0.0.1:8080"
# The address of a running ``sandhold serve``, as the Sandbox API reads it too.
URL_VARIABLE = "SANDHOLD_URL"
# The CLI's name for it before issue 32: still read when SANDHOLD_URL is not set, with a warning.
DEPRECATED_URL_VARIABLE = "SANDHOLD_SERVER"
# The longest silence to wait through for an answer: the default policy's longest command
# (300 s) and some margin; a call that names a longer timeout_s gets that plus the margin.
ANSWER_TIMEOUT = 330.0
ANSWER_MARGIN = 30.0
# The server caps its own output per request well below this; refuse to hold more.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
# Fields shown as text blocks, in this order, rather than in the table of fields.
TEXT_FIELDS = ("stdout", "output", "result_repr", "content", "stderr", "traceback")
HEAD_FIELDS = frozenset({"success", "operation", "error_type", "error_message"})


@dataclass(frozen=True)
class Answer:
    """A server's answer: the HTTP status and the structured result (``success`` first)."""

    status: int
    result: dict[str, Any]

    @property
    def request_failed(self) -> bool:
        """The request itself failed (any status but 200), as opposed to the work it asked for."""
        return self.status != 200


class ServerClient:
    """Tool calls over the HTTP API of ``sandhold serve``: one blocking ``POST /v1/{tool}``
    each."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url.rstrip("/")
        self._key = key

    def call(self, tool: str, arguments: Any, *, timeout: float = ANSWER_TIMEOUT) -> Answer:
        # Here: http.client and ssl cost `sandhold --help`, which imports this module, ~10 ms.
        import urllib.error
        import urllib.request

        request = urllib.request.Request(  # noqa: S310 (the scheme is checked in _endpoint)
            self._endpoint(tool),
            data=json.dumps(arguments).encode(),
            headers={"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            # urllib's timeout bounds the connect and each read alike: the longest silence.
            with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310
                return Answer(reply.status, _result(reply.read(MAX_ANSWER_BYTES + 1)))
        except urllib.error.HTTPError as exc:
            with exc:
                return Answer(exc.code, _result(exc.read(MAX_ANSWER_BYTES + 1), exc.code))
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise BackendUnavailableError(
                f"cannot reach sandhold at {self.url}: {reason}"
            ) from None

    def _endpoint(self, tool: str) -> str:
        if urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            raise InvalidArgumentError(f"server URL must be http(s)://host:port, got {self.url!r}")
        return f"{self.url}/v1/{urllib.parse.quote(tool, safe='')}"


def _result(body: bytes, status: int = 200) -> dict[str, Any]:
    if len(body) > MAX_ANSWER_BYTES:
        raise OrchestratorError(f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
    try:
        result = json.loads(body)
    except ValueError:
        result = None
    if not isinstance(result, dict) or "success" not in result:
        raise OrchestratorError(f"the server answered HTTP {status} without an sandhold result")
    return result


def resolve_key(key: str | None) -> str:
    """``--key`` or ``SANDHOLD_API_KEY``, else the key ``sandhold serve`` keeps for its local
    tenant."""
    if key:
        return key
    from orchestrator._core.tenants import LOCAL_KEY_FILE, data_dir, local_key

    directory = data_dir()
    if not (directory / LOCAL_KEY_FILE).exists():  # never make a key a server does not know
        raise InvalidArgumentError(
            f"no API key: give --key or SANDHOLD_API_KEY (no local key in {directory})"
        )
    return local_key(directory)[0]


def server_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """``SANDHOLD_URL``, else the deprecated ``SANDHOLD_SERVER`` (with a warning on stderr)."""
    if url := environ.get(URL_VARIABLE):
        return url
    if url := environ.get(DEPRECATED_URL_VARIABLE):
        typer.echo(
            f"sandhold: {DEPRECATED_URL_VARIABLE} is deprecated; set {URL_VARIABLE} instead "
            "(the Sandbox API reads it too)",
            err=True,
        )
        return url
    return None


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
            f"{DEFAULT_SERVER})."
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
        client = ServerClient(server or server_from_env() or DEFAULT_SERVER, resolve_key(key))
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


def answer_timeout(arguments: dict[str, Any]) -> float:
    """How long to wait for the answer to a call that may itself wait ``timeout_s``."""
    given = arguments.get("timeout_s")
    if isinstance(given, int | float) and not isinstance(given, bool) and given > 0:
        return max(ANSWER_TIMEOUT, min(float(given), 86_400.0) + ANSWER_MARGIN)
    return ANSWER_TIMEOUT


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
