"""``sandhold``: the command line. Presentation only: every command calls the library and shows what
it returns; an sandhold error becomes one line ``error: <code>: <message>`` and exit status 2."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from typing import TYPE_CHECKING

from orchestrator.cli._front import front_options, run_front

if TYPE_CHECKING:
    import typer

__all__ = ["main"]

# Each command and group: (name, module, attribute), in the order ``sandhold --help`` lists them. A
# command's module is imported only when the command runs or all are listed, so ``sandhold mcp``
# starts without the HTTP server, the image builder or the policy tools. And the modules are light:
# at their top only typer, rich and what the options need; what a command does is imported inside
# the function that does it, so listing every command (``--help``) imports none of that work
# (tests/unit/test_cli_imports.py names what must stay out).
GROUPS = (
    ("audit", "orchestrator.cli.audit", "audit_app"),
    ("image", "orchestrator.cli.image", "image_app"),
    ("policy", "orchestrator.cli.policy", "policy_app"),
    ("tenant", "orchestrator.cli.tenant", "tenant_app"),
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


def _app() -> typer.Typer:
    """The app with its global options (typer is imported here: ``mcp --connect`` starts
    without it)."""
    import typer

    app = typer.Typer(
        name="sandhold",
        help="Container-isolated Python sandboxes.",
        no_args_is_help=True,
        add_completion=False,
    )

    def _print_version(value: bool) -> None:
        if value:
            from importlib.metadata import PackageNotFoundError, version

            try:
                typer.echo(f"sandhold {version('sandhold')}")
            except PackageNotFoundError:
                typer.echo("sandhold (not installed as a package)")
            raise typer.Exit()

    @app.callback()
    def _options(
        show_version: bool = typer.Option(
            False, "--version", is_eager=True, callback=_print_version, help="Print the version."
        ),
    ) -> None:
        """Container-isolated Python sandboxes."""

    return app


def register(only: str | None = None) -> typer.Typer:
    """The app with every command and group, or only the one named ``only`` (when known)."""
    app = _app()
    known = {name for name, _, _ in (*GROUPS, *COMMANDS)}
    wanted = only if only in known else None
    for name, module, attribute in GROUPS:
        if wanted in (None, name):
            app.add_typer(getattr(importlib.import_module(module), attribute), name=name)
    for name, module, attribute in COMMANDS:
        if wanted in (None, name):
            app.command(name)(getattr(importlib.import_module(module), attribute))
    return app


def _migrate_data_dir() -> None:
    from orchestrator._core import migrate_legacy_data_dir

    try:
        moved = migrate_legacy_data_dir()
    except OSError as exc:
        print(f"sandhold: could not move the old data directory: {exc}", file=sys.stderr)
        return
    if moved is not None:
        print(f"sandhold: moved the data directory of the old name to {moved}", file=sys.stderr)


def main() -> None:
    """Console script entry point."""
    _migrate_data_dir()
    front = front_options(sys.argv[1:], os.environ)
    if front is not None:  # before typer is imported: see orchestrator.cli._front
        status = run_front(front)
        gc.freeze()  # as below
        sys.exit(status)
    import typer

    try:
        register(sys.argv[1] if len(sys.argv) > 1 else None)()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    finally:
        # The command is done and nothing it left needs collecting: without this, the
        # interpreter's teardown walks every object the imports made (~50 ms of `sandhold ps`).
        gc.freeze()


if __name__ == "__main__":
    main()
