"""``sandhold policy test``: run policy test cases in real sandboxes, through ``Orchestrator.call``
(the path every interface takes), and report what each got against what it expected.

Sessions. Cases must not influence each other, so every case runs in a session of its own that
is destroyed afterwards, with one exception that keeps the suites fast: a ``python`` case without
``setup`` under a restricted policy that allows neither ``open`` nor any module reaching files,
processes or the network (``policy_sessions.poolable``) borrows an idle session of that policy
from a pool, and the session goes back only after a ``reset`` (a fresh interpreter) unless the
code was refused before it ran. Such code leaves nothing in the container but interpreter state,
which the reset discards; code that gets past the restrictions has already failed its case.

Invariants: at most ``jobs`` cases run at once; a policy's pooled sessions belong to one test
tenant and never outnumber that policy's ``max_sessions_per_owner``; every other session belongs
to a tenant of its own, so no case waits on another's quota; every session the runner opens is
destroyed before ``run`` returns (shielded, bounded), and ``Orchestrator.aclose`` catches the rest.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from orchestrator._api import Orchestrator
from orchestrator.errors import InvalidArgumentError
from orchestrator.policy.commands import decide
from orchestrator.policy.model import Policy, load_policy, shipped_policy_names
from orchestrator.policy_ci.cases import CaseSpec
from orchestrator.policy_ci.jobs import DEFAULT_JOBS, MAX_JOBS
from orchestrator.policy_ci.outcomes import Outcome, Status, expected_text, judge
from orchestrator.policy_ci.sessions import CaseError, SessionPool, run_operation

__all__ = [
    "DEFAULT_JOBS",
    "MAX_JOBS",
    "CasePlan",
    "CaseReport",
    "CaseRun",
    "PolicyTarget",
    "PolicyTestRunner",
    "load_target",
    "plan",
    "summary",
]

log = logging.getLogger(__name__)

# Beyond the case's own timeout: session start-up, setup commands, teardown of the case.
CASE_OVERHEAD_S = 60.0
# What sessions are opened with: the ``policy`` argument of the tools.
_POLICY_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class PolicyTarget:
    """The policies under test: every ``*.toml`` of a directory, or one file, by lookup name."""

    directory: Path
    policies: dict[str, Policy]


@dataclass(frozen=True)
class CaseRun:
    spec: CaseSpec
    policy: str

    @property
    def label(self) -> str:
        return f"{self.spec.case.name} [{self.policy}]"


@dataclass(frozen=True)
class CaseReport:
    run: CaseRun
    status: Status
    expected: str
    got: str
    rule: str
    detail: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class CasePlan:
    runs: list[CaseRun]
    skipped: list[CaseRun] = field(default_factory=list)


def load_target(path: Path) -> PolicyTarget:
    """The policies a directory holds, or the one a file holds, keyed by the name sessions are
    opened with (the file's stem)."""
    if path.is_dir():
        files = sorted(p for p in path.glob("*.toml") if p.is_file())
        directory = path
    elif path.is_file():
        files, directory = [path], path.parent
    else:
        raise InvalidArgumentError(f"{path}: no such policy file or directory")
    if not files:
        raise InvalidArgumentError(f"{path}: no policy files (*.toml) in this directory")
    for file in files:
        if not _POLICY_NAME.match(file.stem):
            raise InvalidArgumentError(f"{file}: the file name is not a policy name")
    policies = {file.stem: load_policy(file.stem, search_dirs=(directory,)) for file in files}
    return PolicyTarget(directory, policies)


def plan(specs: Sequence[CaseSpec], target: PolicyTarget) -> CasePlan:
    """One run per case and policy under test; a case naming a policy that is neither under test
    nor shipped is an error (a typo), one naming a shipped policy not under test is skipped."""
    known = set(target.policies) | set(shipped_policy_names())
    runs: list[CaseRun] = []
    skipped: list[CaseRun] = []
    for spec in specs:
        for name in spec.policies:
            if name not in known:
                raise InvalidArgumentError(f"{spec.where}: unknown policy {name!r}")
            (runs if name in target.policies else skipped).append(CaseRun(spec, name))
    if not runs:
        raise InvalidArgumentError("no case runs under the policies given")
    return CasePlan(runs, skipped)


class PolicyTestRunner:
    """Runs case runs on one started orchestrator, ``jobs`` at a time."""

    def __init__(self, orchestrator: Orchestrator, *, jobs: int = DEFAULT_JOBS) -> None:
        if not 1 <= jobs <= MAX_JOBS:
            raise InvalidArgumentError(f"jobs must be in 1..{MAX_JOBS}")
        self._orchestrator = orchestrator
        self._jobs = jobs
        self._run_id = secrets.token_hex(4)

    async def run(
        self,
        runs: Sequence[CaseRun],
        *,
        on_report: Callable[[CaseReport], None] | None = None,
    ) -> list[CaseReport]:
        """Reports in the order of ``runs``."""
        limiter = anyio.CapacityLimiter(self._jobs)
        pools = {
            name: SessionPool(self._orchestrator, name, self._jobs, self._run_id)
            for name in dict.fromkeys(run.policy for run in runs)
        }
        reports: list[CaseReport | None] = [None] * len(runs)

        async def one(index: int, run: CaseRun) -> None:
            async with limiter:
                report = await self._run_one(index, run, pools[run.policy])
            reports[index] = report
            if on_report is not None:
                on_report(report)

        try:
            async with anyio.create_task_group() as group:
                for index, run in enumerate(runs):
                    group.start_soon(one, index, run)
        finally:
            for pool in pools.values():
                await pool.aclose()
        return [report for report in reports if report is not None]

    def _policy(self, name: str) -> Policy:
        return self._orchestrator.policy(name)

    async def _run_one(self, index: int, run: CaseRun, pool: SessionPool) -> CaseReport:
        case = run.spec.case
        policy = self._policy(run.policy)
        expected = expected_text(case)
        started = time.monotonic()
        deadline = (case.timeout_s or policy.timeouts.command_s) + CASE_OVERHEAD_S
        tenant = f"policy-test-{self._run_id}-{index}"
        try:
            with anyio.fail_after(deadline):
                got = await run_operation(self._orchestrator, case, run.policy, pool, tenant=tenant)
        except CaseError as exc:
            return CaseReport(run, "error", expected, "error", "-", str(exc), _since(started))
        except TimeoutError:
            detail = f"no answer within {deadline:g} s"
            return CaseReport(run, "error", expected, "error", "-", detail, _since(started))
        except Exception as exc:  # one case's failure is reported, the others still run
            log.exception("policy case %s failed to run", run.label)
            detail = f"{type(exc).__name__}: {exc}"
            return CaseReport(run, "error", expected, "error", "-", detail, _since(started))
        status, detail = judge(case, got)
        return CaseReport(
            run, status, expected, got.describe(), _rule(run, policy, got), detail, _since(started)
        )


def _rule(run: CaseRun, policy: Policy, got: Outcome) -> str:
    """The deciding rule: the one a refusal named; for an allowed command the command policy's
    rule that let it through (``shell.enabled`` when no pattern matched); for allowed code the
    Python mode that let it run."""
    case = run.spec.case
    if not got.allowed:
        return got.rule
    command = case.command if case.command is not None else case.process
    if command is not None:
        rule = decide(command, policy, confirm_dangerous=case.confirm_dangerous).rule
        return "shell.enabled" if rule == "default" else rule
    if case.python is not None:
        return "python.mode" if policy.python.mode == "unrestricted" else "python.rules"
    return got.rule


def _since(started: float) -> float:
    return time.monotonic() - started


def summary(reports: Sequence[CaseReport]) -> dict[Status, int]:
    counts: dict[Status, int] = {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    for report in reports:
        counts[report.status] += 1
    return counts
