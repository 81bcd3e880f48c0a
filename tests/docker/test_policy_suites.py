"""``sandhold policy test`` against real sandboxes: the shipped suites pass against the shipped
policies, and a deliberately loosened default fails them with a readable table and JUnit XML
naming the failing cases, which ``sandhold policy diff`` shows as the loosening it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.images import ImageBuildResult
from orchestrator.policy_ci.cases import load_cases
from orchestrator.policy_ci.runner import PolicyTestRunner, load_target, plan
from tests.conftest import RUN_ID, TEST_RUN_LABEL
from tests.docker.test_python_repl import config

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
SUITES = POLICIES / "tests"
# The shipped suites take about two minutes on two busy cores; this is the bound, not the aim.
SUITE_TIMEOUT = 900


def sandhold(*args: str, image: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SANDHOLD_EXTRA_LABELS=f"{TEST_RUN_LABEL}={RUN_ID}", COLUMNS="200")
    if image:
        env["SANDHOLD_IMAGE"] = image
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
        env=env,
        cwd=ROOT,
    )


def junit_cases(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    return {case.attrib["name"]: case for case in root.iter("testcase")}


def loosened_default(directory: Path) -> Path:
    """The shipped default with ``os`` moved to the allowlist and every deny pattern gone."""
    text = (POLICIES / "default.toml").read_text()
    text = text.replace('"os", "sys", "subprocess"', '"sys", "subprocess"')
    text = text.replace('"typing", "unicodedata",', '"typing", "unicodedata", "os",')
    start = text.index("deny_patterns = [")
    end = text.index("]\n", start) + 1
    text = text[:start] + "deny_patterns = []" + text[end:]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "default.toml"
    path.write_text(text)
    return path


@pytest.mark.docker
def test_the_shipped_suites_pass_against_the_shipped_policies(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    report = tmp_path / "junit.xml"
    result = sandhold(
        "policy", "test", "policies/", "--cases", "policies/tests/", "--junit", str(report),
        image=worker_image.tag,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    runs = sum(len(spec.policies) for spec in load_cases(SUITES))
    assert f"{runs} case runs: {runs} passed, 0 failed, 0 errors" in result.stdout
    root = ET.parse(report).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == (str(runs), "0", "0")


@pytest.mark.docker
def test_a_loosened_default_fails_with_a_table_and_junit_naming_the_failing_cases(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    loosened_default(tmp_path / "policies")
    report = tmp_path / "junit.xml"
    result = sandhold(
        "policy", "test", str(tmp_path / "policies"), "--cases", "policies/tests/",
        "--junit", str(report),
        image=worker_image.tag,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-6000:] + result.stderr[-2000:]
    out = result.stdout
    for column in ("case", "policy", "expected", "got", "rule", "time", "result"):
        assert column in out.splitlines()[2]
    assert "FAIL policies/tests/python_escapes.toml: case[37] 'import os' under 'default'" in out
    assert "FAIL policies/tests/shell.toml: case[4] 'sudo is refused' under 'default'" in out
    assert "skipped (policy not under test)" in out

    cases = junit_cases(report)
    for failing in (
        "import os [default]",
        "sudo is refused [default]",
        "docker is refused [default]",
    ):
        failure = cases[failing].find("failure")
        assert failure is not None, failing
        assert "but it was allowed" in failure.attrib["message"]
    for passing in ("eval of a string [default]", "the root filesystem is read-only [default]"):
        assert cases[passing].find("failure") is None, passing
    assert cases["import os [strict]"].find("skipped") is not None


def test_diff_shows_the_loosening_riskiest_first(tmp_path: Path) -> None:
    loosened = loosened_default(tmp_path)
    result = sandhold("policy", "diff", "default", str(loosened), "--json")
    assert result.returncode == 0, result.stderr
    changes = json.loads(result.stdout)["changes"]
    assert changes[0] == {
        "key": "python.modules",
        "direction": "loosened",
        "risk": "critical",
        "old": "blocked",
        "new": "importable",
        "summary": "import of 'os' now allowed",
    }
    denied = [c for c in changes if c["key"] == "shell.deny_patterns"]
    assert len(denied) == 3 and {c["direction"] for c in denied} == {"loosened"}
    assert {c["direction"] for c in changes} == {"loosened"}

    gate = sandhold("policy", "diff", "default", str(loosened), "--fail-on", "high")
    assert gate.returncode == 1
    assert "import of 'os' now allowed" in gate.stdout


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_pooled_session_carries_nothing_from_one_case_to_the_next(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    cases = tmp_path / "leak.toml"
    cases.write_text(
        'policies = ["default"]\n'
        '[[case]]\nname = "define"\npython = "leak = 1"\nexpect = "allowed"\n'
        '[[case]]\nname = "refused"\npython = "import os"\nexpect = "denied"\n'
        'error_type = "import_blocked"\n'
        '[[case]]\nname = "look"\npython = "leak"\nexpect = "denied"\nerror_type = "NameError"\n'
    )
    target = load_target(POLICIES)
    runs = plan(load_cases(cases), target).runs
    async with Orchestrator(config(worker_image.tag, policy_dirs=(POLICIES,))) as orch:
        with anyio.fail_after(120):
            reports = await PolicyTestRunner(orch, jobs=1).run(runs)
        assert [r.status for r in reports] == ["pass", "pass", "pass"], reports
        left = await orch.backend.list_containers({LABEL_ORCHESTRATOR: orch.orchestrator_id})
        assert left == []
