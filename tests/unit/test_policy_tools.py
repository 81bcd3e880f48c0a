"""Policy tooling without a container: the case-file format, planning, rule naming, judging,
JUnit output, ``explain`` and ``diff``; and ``explain`` agreeing with the shipped suites."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from orchestrator.errors import InvalidArgumentError, PolicyFileError
from orchestrator.policy.model import Policy, load_policy
from orchestrator.policy_ci.cases import PolicyCase, load_case_file, load_cases
from orchestrator.policy_ci.diff import diff
from orchestrator.policy_ci.explain import explain_code, explain_command
from orchestrator.policy_ci.junit import junit_xml
from orchestrator.policy_ci.outcomes import Outcome, expected_text, judge
from orchestrator.policy_ci.rules import rule_matches, rules_of
from orchestrator.policy_ci.runner import CaseReport, CaseRun, load_target, plan
from orchestrator.policy_ci.sessions import poolable

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / "policies" / "tests"

VALID = """
policies = ["default", "strict"]

[[case]]
name = "import os"
python = "import os"
expect = "denied"
error_type = "import_blocked"
rule = "python.forbidden_modules"

[[case]]
name = "echo"
policies = ["shell"]
command = "echo hi"
expect = "allowed"
exit_code = 0
stdout = "hi\\n"

[[case]]
name = "list the workspace"
policies = ["default"]
call = { tool = "files", operation = "list", path = "." }
expect = "allowed"
"""


def write(tmp_path: Path, text: str, name: str = "cases.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def case(**fields: object) -> PolicyCase:
    return PolicyCase.model_validate({"name": "c", "policies": ["default"], **fields})


# --- the case-file format -------------------------------------------------------------------


def test_a_case_file_gives_each_case_its_operation_and_policies(tmp_path: Path) -> None:
    specs = load_case_file(write(tmp_path, VALID))
    assert [(s.case.kind, s.policies) for s in specs] == [
        ("python", ("default", "strict")),
        ("command", ("shell",)),
        ("call", ("default",)),
    ]
    assert specs[0].where.endswith("case[0] 'import os'")
    assert specs[2].case.operation_text == "tool='files' operation='list' path='.'"


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        (
            '[[case]]\nname="a"\npolicies=["default"]\npython="1"\nexpect="allowed"\nbogus=1',
            "case[0].bogus",
            "unknown key",
        ),
        (
            '[[case]]\nname="a"\npolicies=["default"]\npython="1"\ncommand="x"\nexpect="allowed"',
            "case[0]",
            "exactly one operation",
        ),
        (
            '[[case]]\nname="a"\npolicies=["default"]\npython="1"\nexpect="denied"',
            "case[0]",
            "needs error_type",
        ),
        (
            '[[case]]\nname="a"\npolicies=["default"]\npython="1"\nexpect="allowed"\nrule="x"',
            "case[0]",
            "rule goes only with",
        ),
        (
            '[[case]]\nname="a"\npolicies=["default"]\npython="1"\nexpect="maybe"',
            "case[0].expect",
            "",
        ),
        (
            '[[case]]\nname="a"\npython="1"\nexpect="allowed"',
            "case[0].policies",
            "no policies",
        ),
        (
            '[[case]]\nname="a"\npolicies=["Not A Name"]\npython="1"\nexpect="allowed"',
            "case[0].policies[0]",
            "",
        ),
        (
            '[[case]]\nname="a"\npolicies=["default"]\ncall={tool="nope", operation="x"}\n'
            'expect="allowed"',
            "case[0]",
            "call.tool must be one of",
        ),
        (
            '[[case]]\nname="a"\npolicies=["default"]\npython="1"\ncontent="x"\nexpect="allowed"',
            "case[0]",
            "write needs content",
        ),
        (
            'policies=["default"]\n[[case]]\nname="a"\npython="1"\nexpect="allowed"\n'
            '[[case]]\nname="a"\npython="2"\nexpect="allowed"',
            "case[1].name",
            "duplicate case name 'a' (also case[0])",
        ),
        ("case = [", "-", "not valid TOML"),
        ('policies = ["default"]', "case", ""),
    ],
)
def test_a_bad_case_file_is_refused_naming_file_key_and_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyFileError) as caught:
        load_case_file(path)
    assert caught.value.code == "invalid_argument"
    assert (caught.value.file, caught.value.key) == (str(path), key)
    assert reason in caught.value.reason


def test_a_directory_of_case_files_loads_every_file_in_order(tmp_path: Path) -> None:
    write(tmp_path, VALID, "b.toml")
    write(tmp_path, VALID, "a.toml")
    assert [s.file.name for s in load_cases(tmp_path)][::3] == ["a.toml", "b.toml"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyFileError, match="no case files"):
        load_cases(tmp_path / "empty")
    with pytest.raises(PolicyFileError, match="no such file"):
        load_cases(tmp_path / "missing")


# --- planning -------------------------------------------------------------------------------


def test_the_shipped_suites_cover_every_shipped_policy_and_plan_without_skips() -> None:
    specs = load_cases(SUITES)
    test_plan = plan(specs, load_target(ROOT / "policies"))
    assert test_plan.skipped == []
    assert {run.policy for run in test_plan.runs} == {
        "default",
        "strict",
        "shell",
        "unrestricted-python",
    }


def test_a_single_policy_file_runs_its_cases_and_skips_the_others(tmp_path: Path) -> None:
    target = load_target(ROOT / "policies" / "strict.toml")
    test_plan = plan(load_case_file(write(tmp_path, VALID)), target)
    assert [(r.spec.case.name, r.policy) for r in test_plan.runs] == [("import os", "strict")]
    assert {r.policy for r in test_plan.skipped} == {"default", "shell"}


def test_a_case_naming_an_unknown_policy_is_an_error_not_a_skip(tmp_path: Path) -> None:
    text = VALID.replace('policies = ["shell"]', 'policies = ["shel"]')
    with pytest.raises(InvalidArgumentError, match="unknown policy 'shel'"):
        plan(load_case_file(write(tmp_path, text)), load_target(ROOT / "policies"))


def test_a_policy_file_whose_name_is_not_a_policy_name_is_refused(tmp_path: Path) -> None:
    write(tmp_path, 'name = "x"\n', "Not A Name.toml")
    with pytest.raises(InvalidArgumentError, match="not a policy name"):
        load_target(tmp_path)


# --- rules and judging ----------------------------------------------------------------------


def test_rules_are_named_from_what_the_tools_return() -> None:
    sudo = {
        "success": False,
        "error_type": "policy",
        "error_message": "command denied (shell.deny_patterns['(^|[;&|]\\\\s*)(sudo|su)\\\\b'])",
    }
    assert rules_of(sudo) == ["shell.deny_patterns['(^|[;&|]\\\\s*)(sudo|su)\\\\b']"]
    static = {
        "success": False,
        "error_type": "validation",
        "error_message": "code rejected: ...",
        "violations": [
            "line 2: interpreter internals attribute 'f_globals' is not allowed",
            "line 5: decorator 'exec' is not allowed",
            "line 5: forbidden builtin 'exec' is not allowed",
        ],
    }
    assert rules_of(static) == [
        "python.rules.internals",
        "python.rules.decorator",
        "python.forbidden_builtins['exec']",
    ]
    runtime = {
        "success": False,
        "error_type": "import_blocked",
        "error_message": "module 'sys' reached through '.sys' is blocked: module 'sys' is "
        "forbidden by the policy",
        "violations": [],
    }
    assert rules_of(runtime) == ["python.forbidden_modules['sys']"]
    message = "path '/etc/passwd' is outside /workspace"
    outside = {"success": False, "error_type": "invalid_argument", "error_message": message}
    assert rules_of(outside) == ["files.workspace"]
    erofs = {"success": False, "error_type": "OSError", "error_message": "[Errno 30] Read-only"}
    assert rules_of(erofs) == ["container"]
    assert rules_of({"success": True}) == []


def test_an_expected_rule_matches_in_full_or_as_a_prefix_ending_at_a_bracket_or_dot() -> None:
    rules = ["shell.deny_patterns['x']", "python.rules.dunder_attribute"]
    assert rule_matches("shell.deny_patterns", rules)
    assert rule_matches("shell.deny_patterns['x']", rules)
    assert rule_matches("python.rules", rules)
    assert not rule_matches("shell.deny", rules)
    assert not rule_matches("shell.dangerous_patterns", rules)


def test_judging_compares_outcome_error_type_rule_and_output() -> None:
    denied = case(python="import os", expect="denied", error_type="import_blocked", rule="python")
    refused = Outcome(False, "import_blocked", "m", ("python.forbidden_modules['os']",))
    assert judge(denied, refused) == ("pass", "")
    status, why = judge(denied, Outcome(True, stdout="ok\n"))
    assert status == "fail" and "but it was allowed" in why and "'ok\\n'" in why
    status, why = judge(denied, Outcome(False, "validation", "m", ("python.rules.x",)))
    assert status == "fail" and "error_type validation, expected import_blocked" in why

    allowed = case(command="echo hi", expect="allowed", exit_code=0, stdout="hi\n")
    assert expected_text(allowed) == "allowed, exit 0 + stdout"
    assert judge(allowed, Outcome(True, exit_code=0, stdout="hi\n"))[0] == "pass"
    status, why = judge(allowed, Outcome(True, exit_code=1, stdout="hi\n"))
    assert status == "fail" and why == "exit code 1, expected 0"
    status, why = judge(allowed, Outcome(False, "policy", "no", ("shell.enabled",)))
    assert status == "fail" and why.startswith("expected allowed, got policy (shell.enabled)")


def test_junit_names_each_case_and_policy_with_its_failure(tmp_path: Path) -> None:
    specs = load_case_file(write(tmp_path, VALID))
    runs = [CaseRun(specs[0], "default"), CaseRun(specs[0], "strict")]
    reports = [
        CaseReport(
            runs[0], "fail", "denied: import_blocked", "allowed", "-", "it was allowed", 1.5
        ),
        CaseReport(runs[1], "pass", "denied: import_blocked", "denied: import_blocked", "r"),
    ]
    skipped = [CaseRun(specs[1], "shell")]
    policies = {"default": load_policy("default")}
    root = ET.fromstring(junit_xml(reports, skipped, policies, seconds=2.0))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failure = cases["import os [default]"].find("failure")
    assert failure is not None and failure.get("message") == "it was allowed"
    assert "python: import os" in (failure.text or "")
    assert cases["import os [strict]"].find("failure") is None
    assert cases["echo [shell]"].find("skipped") is not None
    hashes = [p.get("value") for p in root.iter("property") if p.get("name", "").endswith(".hash")]
    assert hashes and hashes[0] == policies["default"].hash


# --- explain --------------------------------------------------------------------------------


def test_explain_names_the_static_rule_that_refuses_code() -> None:
    default = load_policy("default")
    dunder = explain_code(default, "().__class__.__bases__")
    assert (dunder.decision, dunder.error_type) == ("denied", "validation")
    assert dunder.rule == "python.rules.dunder_attribute" and len(dunder.findings) == 2
    assert dunder.run_time == ()
    blocked = explain_code(default, "import os")
    assert (blocked.error_type, blocked.rule) == (
        "import_blocked",
        "python.forbidden_modules['os']",
    )
    syntax = explain_code(default, "x = (")
    assert (syntax.decision, syntax.error_type) == ("denied", "SyntaxError")


def test_explain_marks_what_only_a_run_can_tell() -> None:
    explained = explain_code(load_policy("default"), "import typing\ntyping.sys\n'{0.x}'.format(1)")
    assert explained.decision == "allowed"
    notes = "\n".join(explained.run_time)
    assert "python.forbidden_modules['sys']" in notes
    assert "format string" in notes
    assert "memory 512 MiB" in notes
    free = explain_code(load_policy("unrestricted-python"), "import os")
    assert (free.decision, free.rule) == ("allowed", "python.mode")


def test_explain_of_a_command_lists_every_rule_that_matched() -> None:
    default = load_policy("default")
    sudo = explain_command(default, "sudo id")
    assert (sudo.decision, sudo.error_type) == ("denied", "policy")
    assert sudo.rule.startswith("shell.deny_patterns[")
    rm = explain_command(default, "rm -rf /workspace/x")
    assert rm.decision == "denied" and rm.rule.startswith("shell.dangerous_patterns[")
    confirmed = explain_command(default, "rm -rf /workspace/x", confirm_dangerous=True)
    assert confirmed.decision == "allowed" and confirmed.run_time
    curl = explain_command(default, "curl http://example.com")
    assert any("network" in note for note in curl.run_time)
    strict = explain_command(load_policy("strict"), "ls")
    assert (strict.decision, strict.rule) == ("denied", "shell.enabled")
    listed = default.model_copy(
        update={"shell": default.shell.model_copy(update={"allow_commands": ("ls",)})}
    )
    only_ls = explain_command(listed, "ls && cat x")
    assert only_ls.rule == "shell.allow_commands"
    assert [f.verdict for f in only_ls.findings if f.rule == "shell.allow_commands"] == [
        "allow",
        "deny",
    ]


def test_explain_agrees_with_every_shipped_case_it_can_decide_statically() -> None:
    checked = 0
    for spec in load_cases(SUITES):
        test = spec.case
        for name in spec.policies:
            policy = load_policy(name)
            if test.python is not None:
                explained = explain_code(policy, test.python)
            elif test.command is not None:
                explained = explain_command(
                    policy, test.command, confirm_dangerous=test.confirm_dangerous
                )
            else:
                continue
            if explained.decision == "denied":
                assert test.expect == "denied", spec.where
                assert explained.error_type == test.error_type, spec.where
                if test.rule:
                    assert rule_matches(test.rule, [f.rule for f in explained.findings]), spec.where
                checked += 1
            elif test.error_type in ("policy", "import_blocked") and test.python is None:
                pytest.fail(f"{spec.where}: explain allows what the case expects refused")
    assert checked > 60


# --- diff -----------------------------------------------------------------------------------


def loosen(policy: Policy) -> Policy:
    python = policy.python.model_copy(
        update={
            "allowed_modules": (*policy.python.allowed_modules, "os"),
            "forbidden_modules": tuple(m for m in policy.python.forbidden_modules if m != "os"),
            "forbidden_builtins": tuple(b for b in policy.python.forbidden_builtins if b != "eval"),
        }
    )
    shell = policy.shell.model_copy(update={"deny_patterns": ()})
    resources = policy.resources.model_copy(update={"memory_mb": 4096})
    return policy.model_copy(update={"python": python, "shell": shell, "resources": resources})


def test_diff_lists_what_a_loosening_lets_through_riskiest_first() -> None:
    default = load_policy("default")
    changes = diff(default, loosen(default))
    assert [(c.risk, c.key) for c in changes] == [
        ("critical", "python.modules"),
        ("critical", "python.forbidden_builtins"),
        ("high", "shell.deny_patterns"),
        ("high", "shell.deny_patterns"),
        ("high", "shell.deny_patterns"),
        ("medium", "resources.memory_mb"),
    ]
    assert {c.direction for c in changes} == {"loosened"}
    assert changes[0].summary == "import of 'os' now allowed"
    assert diff(default, default) == []


def test_diff_puts_loosening_before_tightening_and_reads_both_ways() -> None:
    default, strict = load_policy("default"), load_policy("strict")
    tighter = diff(default, strict)
    assert {c.direction for c in tighter} == {"tightened"}
    assert (tighter[0].key, tighter[0].risk) == ("shell.enabled", "high")
    looser = diff(strict, default)
    assert looser[0].key == "shell.enabled" and looser[0].direction == "loosened"
    mode = diff(default, load_policy("unrestricted-python"))
    assert [(c.key, c.direction, c.risk) for c in mode] == [("python.mode", "loosened", "critical")]
    shell = diff(default, load_policy("shell"))
    directions = [c.direction for c in shell]
    assert directions == sorted(directions, key=["loosened", "changed", "tightened"].index)


def test_diff_reports_a_forbidden_module_dropped_without_effect_as_low_risk() -> None:
    default = load_policy("default")
    python = default.python.model_copy(
        update={
            "forbidden_modules": tuple(m for m in default.python.forbidden_modules if m != "gc")
        }
    )
    changes = diff(default, default.model_copy(update={"python": python}))
    assert [(c.key, c.risk, c.direction) for c in changes] == [
        ("python.forbidden_modules", "low", "loosened")
    ]


def test_only_policies_whose_code_leaves_no_trace_share_pooled_sessions() -> None:
    assert poolable(load_policy("default")) and poolable(load_policy("strict"))
    assert not poolable(load_policy("unrestricted-python"))
    assert not poolable(load_policy("shell"))
    assert not poolable(loosen(load_policy("default")))  # os is importable
