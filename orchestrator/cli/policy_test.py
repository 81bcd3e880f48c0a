"""``sandhold policy test``, ``sandhold policy explain`` and ``sandhold policy diff``: presentation
of ``policy_tests``, ``policy_explain`` and ``policy_diff``."""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import typer
from rich.console import Console
from rich.text import Text

from orchestrator.cli._common import EXIT_ERROR, reported_errors, stderr, until_terminated
from orchestrator.policy_ci.diff import RISK_ORDER, Risk
from orchestrator.policy_ci.jobs import DEFAULT_JOBS, MAX_JOBS

if TYPE_CHECKING:
    from orchestrator.policy_ci.diff import Change
    from orchestrator.policy_ci.explain import Explanation
    from orchestrator.policy_ci.runner import CasePlan, CaseReport, PolicyTarget

__all__ = ["policy_diff", "policy_explain", "policy_test"]

# A case did not get what it expected (or could not run): the run proved nothing good.
EXIT_FAILED = 1
# CI logs are not terminals; a table squeezed to 80 columns is unreadable there.
LOG_WIDTH = 200
_STYLES = {"pass": "green", "fail": "bold red", "error": "bold magenta", "skip": "dim"}
_VERDICT_STYLES = {"denied": "red", "allowed": "green"}
_RISK_STYLES = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "dim"}


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, LOG_WIDTH)
    return console


def policy_test(
    policy_or_dir: Annotated[
        Path, typer.Argument(help="A policy file, or a directory of policy files.")
    ],
    cases: Annotated[Path, typer.Option("--cases", help="A case file or a directory of them.")],
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Also write JUnit XML to this path.")
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", min=1, max=MAX_JOBS, help="Cases run at once.")
    ] = DEFAULT_JOBS,
) -> None:
    """Run policy test cases in real sandboxes; exit 1 on any mismatch or error."""
    from orchestrator.policy_ci.cases import load_cases
    from orchestrator.policy_ci.junit import junit_xml, write_junit
    from orchestrator.policy_ci.runner import load_target, plan

    with reported_errors():
        target = load_target(policy_or_dir)
        case_plan = plan(load_cases(cases), target)
        started = time.monotonic()
        reports = anyio.run(_run_plan, target, case_plan, jobs)
    elapsed = time.monotonic() - started
    console = _console()
    _show_reports(console, reports, case_plan, elapsed)
    if junit is not None:
        write_junit(junit, junit_xml(reports, case_plan.skipped, target.policies, seconds=elapsed))
        console.print(f"JUnit XML written to {junit}", markup=False)
    failed = any(report.status in ("fail", "error") for report in reports)
    raise typer.Exit(EXIT_FAILED if failed else 0)


async def _run_plan(target: PolicyTarget, case_plan: CasePlan, jobs: int) -> list[CaseReport]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchestrator._api import Orchestrator, OrchestratorConfig
    from orchestrator.policy_ci.runner import PolicyTestRunner

    config = OrchestratorConfig.from_env(
        policy_dirs=(target.directory,),
        orchestrator_id=f"sandhold-policy-test-{secrets.token_hex(4)}",
    )
    async with Orchestrator(config) as orchestrator:
        runner = PolicyTestRunner(orchestrator, jobs=jobs)
        columns = (
            TextColumn("policy cases"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=stderr, transient=True) as progress:
            task = progress.add_task("cases", total=len(case_plan.runs))
            return await until_terminated(
                runner.run(case_plan.runs, on_report=lambda _: progress.advance(task))
            )


def _show_reports(
    console: Console, reports: list[CaseReport], case_plan: CasePlan, elapsed: float
) -> None:
    from rich.table import Table

    from orchestrator.policy_ci.runner import summary

    table = Table(title="sandhold policy test", show_lines=False)
    for column in ("case", "policy", "expected", "got", "rule", "time", "result"):
        table.add_column(column, overflow="fold", no_wrap=column in ("time", "result"))
    for report in reports:
        style = _STYLES[report.status]
        table.add_row(
            Text(f"{report.run.spec.suite}: {report.run.spec.case.name}"),
            Text(report.run.policy),
            Text(report.expected),
            Text(report.got),
            Text(report.rule),
            f"{report.seconds:.2f}s",
            Text(report.status.upper(), style=style),
        )
    console.print(table)
    for report in reports:
        if report.status in ("fail", "error"):
            line = Text(report.status.upper(), style=_STYLES[report.status])
            line.append(f" {report.run.spec.where} under {report.run.policy!r}: {report.detail}")
            console.print(line)
    counts = summary(reports)
    console.print(
        f"{len(reports)} case runs: {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['error']} errors; {len(case_plan.skipped)} skipped (policy not under test); "
        f"{elapsed:.1f} s"
    )


def policy_explain(
    policy: Annotated[str, typer.Argument(help="A policy name or a policy file.")],
    code: Annotated[
        str | None, typer.Option("--code", help="Python code ('-' reads standard input).")
    ] = None,
    command: Annotated[str | None, typer.Option("--command", help="A shell command line.")] = None,
    confirm_dangerous: Annotated[
        bool, typer.Option("--confirm-dangerous", help="As the tools' confirm_dangerous.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Which rule would decide some code or a command, and why, without running anything."""
    from orchestrator.policy.model import load_policy
    from orchestrator.policy_ci.explain import explain_code, explain_command

    if (code is None) == (command is None):
        typer.echo("error: invalid_argument: give exactly one of --code and --command", err=True)
        raise typer.Exit(EXIT_ERROR)
    with reported_errors():
        loaded = load_policy(policy)
        if code is not None:
            explanation = explain_code(loaded, sys.stdin.read() if code == "-" else code)
        else:
            explanation = explain_command(loaded, command, confirm_dangerous=confirm_dangerous)
    console = _console()
    if as_json:
        console.print(json.dumps(explanation.to_dict(), indent=2), markup=False)
    else:
        _show_explanation(console, explanation, loaded.hash)


def _show_explanation(console: Console, explanation: Explanation, policy_hash: str) -> None:
    from rich.table import Table

    head = f"policy {explanation.policy!r} (hash {policy_hash[:12]}), {explanation.subject}"
    console.print(head, markup=False)
    error = f" ({explanation.error_type})" if explanation.error_type else ""
    verdict = Text(explanation.decision + error, style=_VERDICT_STYLES[explanation.decision])
    verdict.append(" by ").append(explanation.rule, style="bold").append(f": {explanation.reason}")
    console.print(verdict)
    if explanation.findings:
        table = Table(title="rules that matched", show_header=True)
        for column in ("verdict", "rule", "reason"):
            table.add_column(column, overflow="fold")
        for finding in explanation.findings:
            table.add_row(Text(finding.verdict), Text(finding.rule), Text(finding.reason))
        console.print(table)
    if explanation.run_time:
        console.print("only a run can tell:")
        for note in explanation.run_time:
            console.print(f"  - {note}", markup=False)
    elif explanation.decision == "denied":
        console.print("nothing would run: the refusal comes before execution")


def policy_diff(
    old: Annotated[str, typer.Argument(help="The policy before (a name or a file).")],
    new: Annotated[str, typer.Argument(help="The policy after (a name or a file).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    fail_on: Annotated[
        Risk | None,
        typer.Option("--fail-on", help="Exit 1 if anything is loosened at this risk or above."),
    ] = None,
) -> None:
    """What became allowed and what became denied between two policies, riskiest first."""
    from orchestrator.policy.model import load_policy
    from orchestrator.policy_ci.diff import diff

    with reported_errors():
        before, after = load_policy(old), load_policy(new)
    changes = diff(before, after)
    console = _console()
    if as_json:
        document = {
            "old": {"policy": old, "hash": before.hash},
            "new": {"policy": new, "hash": after.hash},
            "changes": [change.to_dict() for change in changes],
        }
        console.print(json.dumps(document, indent=2), markup=False)
    else:
        console.print(f"{old} ({before.hash[:12]}) -> {new} ({after.hash[:12]})", markup=False)
        _show_changes(console, changes)
    if fail_on is not None and _loosened_at(changes, fail_on):
        raise typer.Exit(EXIT_FAILED)


def _show_changes(console: Console, changes: list[Change]) -> None:
    from rich.table import Table

    if not changes:
        console.print("no difference in effect")
        return
    table = Table(show_header=True)
    for column in ("risk", "change", "setting", "what it means"):
        table.add_column(column, overflow="fold")
    for change in changes:
        style = _RISK_STYLES[change.risk] if change.direction == "loosened" else "cyan"
        table.add_row(f"[{style}]{change.risk}[/]", change.direction, change.key, change.summary)
    console.print(table)
    loosened = sum(1 for change in changes if change.direction == "loosened")
    console.print(f"{loosened} loosened, {len(changes) - loosened} tightened or changed")


def _loosened_at(changes: list[Change], threshold: Risk) -> bool:
    return any(
        change.direction == "loosened" and RISK_ORDER[change.risk] <= RISK_ORDER[threshold]
        for change in changes
    )
