"""``sandhold audit verify``: check that an audit log is whole and unedited."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli._common import reported_errors, stdout

__all__ = ["audit_app", "audit_verify"]

audit_app = typer.Typer(help="Check the audit log.", no_args_is_help=True)

# Exit status when the log has a problem (2 stays "sandhold could not do it", as everywhere).
EXIT_PROBLEMS = 1


@audit_app.command("verify")
def audit_verify(
    path: Annotated[Path, typer.Argument(help="The audit log directory, or one segment file.")],
    head: Annotated[
        str | None,
        typer.Option(
            "--head", help="The last hash, kept elsewhere: also catches records cut off the end."
        ),
    ] = None,
) -> None:
    """Check every record's hash, sequence number and link to the one before it; exit 1 and
    name each problem (segment file, line, seq) if any."""
    from orchestrator.audit.verify import verify

    with reported_errors():
        report = verify(path, expect_head=head)
    for note in report.notes:
        stdout.print(f"note: {note}", markup=False)
    if report.ok:
        stdout.print(
            f"OK: {report.records} records in {report.segments} segment(s); "
            f"last seq {report.last_seq}, hash {report.last_hash}",
            markup=False,
        )
        return
    for problem in report.problems:
        stdout.print(str(problem), markup=False)
    total = len(report.problems) + report.more_problems
    more = f" ({report.more_problems} not shown)" if report.more_problems else ""
    stdout.print(f"FAILED: {total} problem(s) in {report.records} records{more}", markup=False)
    raise typer.Exit(EXIT_PROBLEMS)
