"""The checks on caller environments (``policy.env``): shape and size are invalid_argument, a
name the sandbox or the policy refuses is ``policy`` with its rule, and a policy cannot lift the
names refused under every policy."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from orchestrator._resources import shipped_policies_dir
from orchestrator.errors import InvalidArgumentError, PolicyFileError, PolicyViolationError
from orchestrator.policy.env import (
    ALWAYS_DENIED,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_TOTAL_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
    check_env,
    merged_env,
)
from orchestrator.policy.model import EnvConfig, Policy, load_policy

DEFAULT = load_policy("default")


def test_no_env_is_an_empty_env() -> None:
    assert check_env(None, DEFAULT) == {}


def test_a_valid_env_is_returned_as_a_plain_dict() -> None:
    env = {"FOO": "1", "_bar9": "", "UNICODE": "é ✓"}
    assert check_env(env, DEFAULT) == env


@pytest.mark.parametrize(
    "env",
    [
        ["FOO=1"],
        "FOO=1",
        {"1FOO": "x"},
        {"FOO-BAR": "x"},
        {"": "x"},
        {"A=B": "x"},
        {"A\0": "x"},
        {7: "x"},
        {"FOO": 1},
        {"FOO": None},
        {"FOO": "a\0b"},
        {"FOO": "\ud800"},
        {"FOO": "x" * (MAX_ENV_VALUE_BYTES + 1)},
        {"FOO": "é" * (MAX_ENV_VALUE_BYTES // 2 + 1)},
        {"X" * (MAX_ENV_NAME_CHARS + 1): "x"},
    ],
)
def test_a_malformed_env_is_an_invalid_argument(env: Any) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        check_env(env, DEFAULT)
    assert caught.value.code == "invalid_argument"


def test_the_longest_name_and_value_are_taken() -> None:
    name = "X" * MAX_ENV_NAME_CHARS
    assert check_env({name: "v" * MAX_ENV_VALUE_BYTES}, DEFAULT)[name] == "v" * MAX_ENV_VALUE_BYTES


def test_an_env_past_the_variable_count_is_refused() -> None:
    check_env({f"V{i}": "x" for i in range(MAX_ENV_VARS)}, DEFAULT)
    with pytest.raises(InvalidArgumentError):
        check_env({f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)}, DEFAULT)


def test_an_env_past_the_total_size_is_refused() -> None:
    each = MAX_ENV_VALUE_BYTES
    count = MAX_ENV_TOTAL_BYTES // each  # names and separators tip it over
    with pytest.raises(InvalidArgumentError, match="in all"):
        check_env({f"V{i}": "x" * each for i in range(count)}, DEFAULT)


def test_a_refusal_names_the_variable_never_its_value() -> None:
    secret = "s3cr3t-value"
    for env in ({"LD_PRELOAD": secret}, {"FOO": secret + "\0"}, {"PYTHONPATH": secret}):
        with pytest.raises((InvalidArgumentError, PolicyViolationError)) as caught:
            check_env(env, DEFAULT)
        assert secret not in str(caught.value)
        assert next(iter(env)) in str(caught.value)


@pytest.mark.parametrize(
    "name",
    [
        "SANDHOLD_WORKER_CONFIG",
        "SANDHOLD_ANYTHING",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "GCONV_PATH",
        "PATH",
        "HOME",
        "BASH_ENV",
        "ENV",
        "BASH_FUNC_x",
        "SHELLOPTS",
        "BASHOPTS",
        "PROMPT_COMMAND",
        "PS4",
        "IFS",
    ],
)
def test_a_name_that_would_subvert_the_sandbox_is_refused_under_any_policy(name: str) -> None:
    lenient = Policy(name="lenient", env=EnvConfig(deny=()))
    for policy in (DEFAULT, lenient):
        with pytest.raises(PolicyViolationError) as caught:
            check_env({name: "x"}, policy)
        assert caught.value.code == "policy"
        assert caught.value.rule == "env.reserved"


@pytest.mark.parametrize(
    "name", ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "NODE_OPTIONS", "PERL5OPT"]
)
def test_the_default_policy_refuses_interpreter_start_up_variables(name: str) -> None:
    with pytest.raises(PolicyViolationError) as caught:
        check_env({name: "x"}, DEFAULT)
    assert caught.value.rule == "env.deny"


def test_a_policy_list_replaces_the_default_list_but_not_the_reserved_names() -> None:
    own = Policy(name="own", env=EnvConfig(deny=("SECRET_*",)))
    assert check_env({"PYTHONPATH": "/workspace/src"}, own) == {"PYTHONPATH": "/workspace/src"}
    with pytest.raises(PolicyViolationError):
        check_env({"SECRET_TOKEN": "x"}, own)
    with pytest.raises(PolicyViolationError):
        check_env({"LD_PRELOAD": "x"}, own)


def test_names_are_matched_case_sensitively_as_programs_read_them() -> None:
    assert check_env({"ld_preload": "x", "Path": "y"}, DEFAULT) == {"ld_preload": "x", "Path": "y"}


def test_the_shipped_default_policy_states_the_models_default_list() -> None:
    with (shipped_policies_dir() / "default.toml").open("rb") as handle:
        shipped = tomllib.load(handle)["env"]["deny"]
    assert tuple(shipped) == EnvConfig().deny == DEFAULT.env.deny


@pytest.mark.parametrize("pattern", ["LD PRELOAD", "FOO?", "[A-Z]*", "", "A" * 257])
def test_a_policy_deny_pattern_must_be_a_name_with_stars(tmp_path: Any, pattern: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f"[env]\ndeny = [{pattern!r}]\n".replace("'", '"'))
    with pytest.raises(PolicyFileError):
        load_policy(path)


def test_reserved_patterns_are_names_with_stars() -> None:
    assert all(p.replace("*", "").replace("_", "").isalnum() for p in ALWAYS_DENIED)


def test_a_command_env_goes_over_the_sessions() -> None:
    assert merged_env({"A": "1", "B": "2"}, {"B": "3"}) == {"A": "1", "B": "3"}


def test_a_session_env_and_a_command_env_together_stay_within_the_bounds() -> None:
    half = {f"S{i}": "x" for i in range(MAX_ENV_VARS)}
    other = {f"C{i}": "x" for i in range(1)}
    with pytest.raises(InvalidArgumentError, match="together"):
        merged_env(half, other)
    big = "x" * MAX_ENV_VALUE_BYTES
    session = {f"S{i}": big for i in range(MAX_ENV_TOTAL_BYTES // MAX_ENV_VALUE_BYTES - 1)}
    with pytest.raises(InvalidArgumentError, match="together"):
        merged_env(session, {"C0": big, "C1": big})
