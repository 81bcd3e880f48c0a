"""``sbx``: the command line. Presentation only: every command calls the library and shows what
it returns; an sbx error becomes one line ``error: <code>: <message>`` and exit status 2."""

from __future__ import annotations

import sys

import typer

from orchestrator.cli.audit import audit_app
from orchestrator.cli.call import call
from orchestrator.cli.image import image_app
from orchestrator.cli.mcp import mcp
from orchestrator.cli.policy import policy_app
from orchestrator.cli.run import run
from orchestrator.cli.serve import serve
from orchestrator.cli.sessions import kill, ps
from orchestrator.cli.shell import shell

app = typer.Typer(
    name="sbx",
    help="Container-isolated Python sandboxes.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"sbx {version('sbx')}")
        except PackageNotFoundError:
            typer.echo("sbx (not installed as a package)")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version."
    ),
) -> None:
    """Container-isolated Python sandboxes."""
app.add_typer(audit_app, name="audit")
app.add_typer(image_app, name="image")
app.add_typer(policy_app, name="policy")
app.command("run")(run)
app.command("mcp")(mcp)
app.command("serve")(serve)
app.command("ps")(ps)
app.command("kill")(kill)
app.command("call")(call)
app.command("shell")(shell)


def main() -> None:
    """Console script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
