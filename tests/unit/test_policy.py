from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import PolicyFileError, UnknownTemplateError
from orchestrator.policy.model import load_policy, shipped_policy_names


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_shipped_policy_loads_and_has_a_stable_hash() -> None:
    names = shipped_policy_names()
    assert names == [
        "agent", "code-interpreter", "code-interpreter-full", "default", "e2b", "pip",
        "python-data", "shell", "strict", "unrestricted-python",
    ]  # fmt: skip
    for name in names:
        assert load_policy(name).hash == load_policy(name).hash
    assert len({load_policy(name).hash for name in names}) == len(names)


def test_default_policy_follows_the_seed_allowlist_and_has_no_network() -> None:
    policy = load_policy("default")
    assert policy.network.mode == "none"
    assert policy.python.mode == "restricted"
    assert {"math", "json", "re", "collections"} <= set(policy.python.allowed_modules)
    assert {"os", "sys", "subprocess", "socket", "ctypes"} <= set(policy.python.forbidden_modules)
    assert {"__import__", "exec", "eval", "open", "getattr"} <= set(
        policy.python.forbidden_builtins
    )


def test_extends_overrides_key_by_key_and_keeps_the_rest(tmp_path: Path) -> None:
    path = write(tmp_path / "child.toml", 'extends = "default"\n[resources]\nmemory_mb = 128\n')
    child, parent = load_policy(path), load_policy("default")
    assert child.name == "child"
    assert child.resources.memory_mb == 128
    assert child.resources.pids == parent.resources.pids
    assert child.python == parent.python
    assert child.extends is None
    assert child.hash != parent.hash


def test_a_child_can_extend_a_sibling_file(tmp_path: Path) -> None:
    write(tmp_path / "base.toml", "[resources]\npids = 64\n")
    child = load_policy(write(tmp_path / "child.toml", 'extends = "base"\n'))
    assert child.resources.pids == 64


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[resources]\nmemory_mb = 0\n", "resources.memory_mb", "greater than or equal"),
        ("[resources]\npids = -1\n", "resources.pids", "greater than or equal"),
        ("[timeouts]\ncommand_s = 0\n", "timeouts.command_s", "greater than or equal"),
        ("[resources]\nmemroy_mb = 64\n", "resources.memroy_mb", "unknown key"),
        ("surprise = 1\n", "surprise", "unknown key"),
        ("[network]\nmode = 'host'\n", "network.mode", "Input should be 'none'"),
        ("[shell]\ndeny_patterns = ['(']\n", "shell.deny_patterns", "invalid regex"),
        ("[timeouts]\ncommand_s = 100\nmax_command_s = 10\n", "timeouts", "must not exceed"),
        ("[resources\n", "-", "not valid TOML"),
        ('extends = "nosuch"\n', "name", "no policy of this name"),
    ],
)
def test_a_broken_file_is_rejected_with_file_key_and_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = write(tmp_path / "broken.toml", text)
    with pytest.raises(PolicyFileError) as caught:
        load_policy(path)
    assert caught.value.code == "invalid_argument"
    assert caught.value.key == key
    assert reason in caught.value.reason
    if key != "name":
        assert caught.value.file == str(path)


def test_an_error_in_a_parent_names_the_parent_file(tmp_path: Path) -> None:
    parent = write(tmp_path / "parent.toml", "[limits]\nterminals_per_session = 0\n")
    with pytest.raises(PolicyFileError) as caught:
        load_policy(write(tmp_path / "child.toml", 'extends = "parent"\n'))
    assert caught.value.file == str(parent)


def test_an_extends_cycle_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "a.toml", 'extends = "b"\n')
    write(tmp_path / "b.toml", 'extends = "a"\n')
    with pytest.raises(PolicyFileError, match="cycle"):
        load_policy(tmp_path / "a.toml")


def test_a_missing_file_is_an_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError) as caught:
        load_policy(tmp_path / "absent.toml")
    assert caught.value.reason == "file not found"


def test_a_policy_names_its_image_template_and_base_is_the_default() -> None:
    assert load_policy("default").image.template == "base"
    data = load_policy("python-data")
    assert data.image.template == "python-data"
    assert data.python.mode == "unrestricted"
    # The container hardening is the default's: only the image, memory and the REPL differ.
    default = load_policy("default")
    assert data.shell == default.shell and data.network == default.network
    assert data.timeouts == default.timeouts and data.output == default.output


def test_a_template_changes_the_hash_and_the_default_image_leaves_it_as_it_was(
    tmp_path: Path,
) -> None:
    same = write(tmp_path / "same.toml", 'extends = "default"\n[image]\ntemplate = "base"\n')
    other = write(tmp_path / "other.toml", 'extends = "default"\n[image]\ntemplate = "x-y"\n')
    base = load_policy("default")
    assert load_policy(same).model_copy(update={"name": "default"}).hash == base.hash
    assert load_policy(other).model_copy(update={"name": "default"}).hash != base.hash


def test_an_unknown_template_is_refused_naming_the_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path / "p.toml", 'extends = "default"\n[image]\ntemplate = "nope"\n')
    with pytest.raises(UnknownTemplateError) as caught:
        load_policy(path, templates=["base", "python-data"])
    assert caught.value.code == "unknown_template"
    assert caught.value.file == str(path) and caught.value.key == "image.template"
    assert "base, python-data" in str(caught.value)
    # Without the orchestrator's list, only the name's form is checked.
    assert load_policy(path).image.template == "nope"


def test_a_template_named_in_a_parent_file_is_refused_in_that_file(tmp_path: Path) -> None:
    parent = write(tmp_path / "parent.toml", '[image]\ntemplate = "gone"\n')
    write(tmp_path / "child.toml", 'extends = "parent"\n')
    with pytest.raises(UnknownTemplateError) as caught:
        load_policy("child", search_dirs=[tmp_path], templates=["base"])
    assert caught.value.file == str(parent)


def test_a_template_name_is_lower_case_letters_digits_and_dashes(tmp_path: Path) -> None:
    path = write(tmp_path / "p.toml", '[image]\ntemplate = "Not/Ok"\n')
    with pytest.raises(PolicyFileError) as caught:
        load_policy(path)
    assert caught.value.key == "image.template"
