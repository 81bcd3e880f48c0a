"""``sbx``: the command line. Presentation only: every command calls the library and shows what
it returns; an sbx error becomes one line ``error: <code>: <message>`` and exit status 2."""

from __future__ import annotations

import importlib
import sys

import typer

__all__ = ["main"]

# Each command and group: (name, module, attribute), in the order ``sbx --help`` lists them. A
# command's module is imported only when the command runs or all are listed, so ``sbx mcp``
# starts without the HTTP server, the image builder or the policy tools.
GROUPS = (
    ("audit", "orchestrator.cli.audit", "audit_app"),
    ("image", "orchestrator.cli.image", "image_app"),
    ("policy", "orchestrator.cli.policy", "policy_app"),
)
COMMANDS = (
    ("run", "orchestrator.cli.run", "run"),
    ("mcp", "orchestrator.cli.mcp", "mcp"),
    ("serve", "orchestrator.cli.serve", "serve"),
    ("ps", "orchestrator.cli.sessions", "ps"),
    ("kill", "orchestrator.cli.sessions", "kill"),
    ("call", "orchestrator.cli.call", "call"),
    ("shell", "orchestrator.cli.shell", "shell"),
)

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


def register(only: str | None = None) -> typer.Typer:
    """``app`` with every command and group, or only the one named ``only`` (when known)."""
    known = {name for name, _, _ in (*GROUPS, *COMMANDS)}
    wanted = only if only in known else None
    for name, module, attribute in GROUPS:
        if wanted in (None, name):
            app.add_typer(getattr(importlib.import_module(module), attribute), name=name)
    for name, module, attribute in COMMANDS:
        if wanted in (None, name):
            app.command(name)(getattr(importlib.import_module(module), attribute))
    return app


def main() -> None:
    """Console script entry point."""
    try:
        register(sys.argv[1] if len(sys.argv) > 1 else None)()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
