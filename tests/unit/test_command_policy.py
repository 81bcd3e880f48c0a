from __future__ import annotations

import pytest

from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.policy.commands import MAX_COMMAND_BYTES, check_command_text, decide, enforce
from orchestrator.policy.model import Policy, load_policy


def with_shell(**changes: object) -> Policy:
    policy = load_policy("default")
    return policy.model_copy(update={"shell": policy.shell.model_copy(update=changes)})


def test_an_ordinary_command_is_allowed_by_the_default_rule() -> None:
    decision = decide("ls -la && echo done", load_policy("default"))
    assert decision.allowed
    assert decision.rule == "default"


@pytest.mark.parametrize("command", ["sudo ls", "echo hi; su root", "docker ps", ":(){ :|:& };:"])
def test_a_denied_command_is_a_policy_error_naming_the_pattern(command: str) -> None:
    with pytest.raises(PolicyViolationError) as caught:
        enforce(command, load_policy("default"))
    assert caught.value.code == "policy"
    assert caught.value.rule.startswith("shell.deny_patterns")


def test_a_dangerous_command_needs_confirmation() -> None:
    policy = load_policy("default")
    with pytest.raises(PolicyViolationError) as caught:
        enforce("rm -rf /workspace/build", policy)
    assert caught.value.rule.startswith("shell.dangerous_patterns")
    assert enforce("rm -rf /workspace/build", policy, confirm_dangerous=True)


def test_a_policy_without_shells_refuses_every_command() -> None:
    with pytest.raises(PolicyViolationError) as caught:
        enforce("echo hi", load_policy("strict"))
    assert caught.value.rule == "shell.enabled"


def test_an_allow_list_checks_every_program_of_a_pipeline() -> None:
    policy = with_shell(allow_commands=("echo", "grep", "ls"))
    assert enforce("echo hi | grep h && ls", policy)
    assert enforce("FOO=1 /bin/ls", policy)
    for command in ("echo hi | python3", "ls; curl x", "echo $(cat /etc/passwd)"):
        with pytest.raises(PolicyViolationError) as caught:
            enforce(command, policy)
        assert caught.value.rule == "shell.allow_commands"


@pytest.mark.parametrize(
    "command",
    [
        "",
        "   ",
        None,
        3,
        "echo \0",
        "x" * (MAX_COMMAND_BYTES + 1),
        "é" * (MAX_COMMAND_BYTES // 2 + 1),
        "echo \ud800",
    ],
)
def test_a_malformed_command_is_an_invalid_argument(command: object) -> None:
    with pytest.raises(InvalidArgumentError):
        enforce(command, load_policy("default"))


def test_confirm_dangerous_must_be_a_boolean() -> None:
    with pytest.raises(InvalidArgumentError):
        enforce("ls", load_policy("default"), confirm_dangerous="yes")


def test_the_command_bound_counts_utf8_bytes_up_to_the_limit() -> None:
    exactly = "é" * (MAX_COMMAND_BYTES // 2)
    assert check_command_text(exactly) == exactly
    assert check_command_text("x" * MAX_COMMAND_BYTES)
