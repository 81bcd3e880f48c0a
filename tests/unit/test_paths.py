"""Lexical confinement of caller paths to /workspace (caller environments: test_env_policy)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import InvalidArgumentError
from orchestrator.session.paths import MAX_PATH_CHARS, workspace_path


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("notes.txt", "/workspace/notes.txt"),
        ("./a/b/../c.txt", "/workspace/a/c.txt"),
        ("a//b/", "/workspace/a/b"),
        (".", "/workspace"),
        ("/workspace", "/workspace"),
        ("/workspace/x/./y", "/workspace/x/y"),
        ("a/../../workspace/b", "/workspace/b"),
        ("..x", "/workspace/..x"),
    ],
)
def test_a_path_inside_the_workspace_is_made_absolute_and_normal(given: str, expected: str) -> None:
    assert workspace_path(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        "/etc/passwd",
        "..",
        "../etc/passwd",
        "a/../../etc",
        "/workspace/../etc",
        "/workspace-other/file",
        "/workspacefile",
        "/",
        "//etc",
    ],
)
def test_a_path_that_leaves_the_workspace_is_refused(given: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        workspace_path(given)
    assert caught.value.code == "invalid_argument"


@pytest.mark.parametrize("given", [None, 7, b"notes.txt", ["a"], "", {"path": "a"}])
def test_a_path_that_is_not_a_non_empty_string_is_refused(given: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        workspace_path(given)


def test_a_path_with_a_nul_byte_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        workspace_path("a\0b")


def test_a_path_past_the_length_limit_is_refused() -> None:
    workspace_path("a" * MAX_PATH_CHARS)
    with pytest.raises(InvalidArgumentError):
        workspace_path("a" * (MAX_PATH_CHARS + 1))


def test_the_argument_name_appears_in_the_refusal() -> None:
    with pytest.raises(InvalidArgumentError, match="cwd"):
        workspace_path("../x", name="cwd")
