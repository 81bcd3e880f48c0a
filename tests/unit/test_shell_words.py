"""The shell policy reads a command as a shell would: its simple commands, quotes and escapes
removed, substitutions lexed as commands of their own."""

from __future__ import annotations

import pytest

from orchestrator.policy.commands import decide, programs
from orchestrator.policy.model import load_policy
from orchestrator.policy.shell_words import simple_commands
from tests.unit.test_command_policy import with_shell


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("r''m -rf /", [["rm", "-rf", "/"]]),
        ('r""m -rf /', [["rm", "-rf", "/"]]),
        ("\\rm -rf /", [["rm", "-rf", "/"]]),
        ("dock''er ps", [["docker", "ps"]]),
        ("$'\\x72\\155' -rf /", [["rm", "-rf", "/"]]),
        ("'a b'\"c d\"e\\ f", [["a bc de f"]]),
        ('echo "a \\"b\\" \\$x \\\\"', [["echo", 'a "b" $x \\']]),
        ("r\\\nm -rf /", [["rm", "-rf", "/"]]),
        ("a; b && c || d | e & f\ng", [["a"], ["b"], ["c"], ["d"], ["e"], ["f"], ["g"]]),
        ("(cd x; ls)", [["cd", "x"], ["ls"]]),
        ("$(echo rm) -rf /", [["echo", "rm"], ["echo rm", "-rf", "/"]]),
        ("`printf r`m x", [["printf", "r"], ["printf rm", "x"]]),
        ('echo "$(whoami)"', [["whoami"], ["echo", "whoami"]]),
        ("diff <(ls a) b", [["ls", "a"], ["diff", "ls a", "b"]]),
        ("ls 2>&1 >out", [["ls", "2", ">&", "1", ">", "out"]]),
        ("ls &>/dev/null & rm x", [["ls", "&>", "/dev/null"], ["rm", "x"]]),
        ("echo $((1 + (2)))", [["echo", "$((1 + (2)))"]]),
        ("echo $x ${y}", [["echo", "$x", "${y}"]]),
        ("echo hi # rm -rf /", [["echo", "hi"]]),
        ("echo a#b", [["echo", "a#b"]]),
        ("echo 'unterminated", [["echo", "unterminated"]]),
        ("echo $(ls", [["ls"], ["echo", "ls"]]),
        ("", []),
    ],
)
def test_a_command_line_splits_into_the_words_a_shell_would_run(
    command: str, expected: list[list[str]]
) -> None:
    assert simple_commands(command) == expected


@pytest.mark.parametrize(
    "command", ["r''m -rf /workspace", "\\rm -rf /workspace", "$(echo rm) -rf x", "rm -r''f x"]
)
def test_a_dangerous_command_spelled_around_still_needs_confirmation(command: str) -> None:
    decision = decide(command, load_policy("default"))
    assert not decision.allowed and decision.rule.startswith("shell.dangerous_patterns")


@pytest.mark.parametrize(
    "command", ["dock''er ps", "d\\ocker ps", "su''do ls", "echo x; 's'udo ls", "`echo docker`"]
)
def test_a_denied_command_spelled_around_is_still_denied(command: str) -> None:
    decision = decide(command, load_policy("default"))
    assert not decision.allowed and decision.rule.startswith("shell.deny_patterns")


def test_quoted_text_that_only_mentions_a_pattern_is_still_judged_as_written() -> None:
    """Raw text is matched too: the patterns err on the side of asking."""
    assert not decide("echo 'rm -rf /'", load_policy("default")).allowed


def test_programs_skip_assignments_redirections_and_keywords() -> None:
    command = "FOO=1 >log /bin/ls; if grep x f; then e''cho y; fi; for i in 1; do cat; done"
    assert programs(command) == ["ls", "grep", "echo", "cat"]


def test_an_allow_list_sees_the_program_a_shell_would_run() -> None:
    policy = with_shell(allow_commands=("echo", "ls"))
    assert decide("e''cho hi && \\ls", policy).allowed
    for command in ("c''url x", "echo `id`", "echo <(id)", "ls | $'\\x63'at"):
        decision = decide(command, policy)
        assert not decision.allowed and decision.rule == "shell.allow_commands", command
