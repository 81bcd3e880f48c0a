"""The policy catalog: names are looked up, never opened; a broken file costs only its own name;
a FIFO in a policy directory is neither served nor read."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import InvalidArgumentError, PolicyFileError, UnknownPolicyError
from orchestrator.policy.catalog import PolicyCatalog
from orchestrator.policy.model import shipped_policy_names


def test_every_shipped_policy_is_in_the_catalog() -> None:
    assert PolicyCatalog.load().names() == shipped_policy_names()


@pytest.mark.parametrize(
    "bad", ["/dev/zero", "../policies/default", "/etc/passwd", "default.toml", "./x", "", 7, 1.5]
)
def test_anything_but_a_name_is_one_error_and_opens_nothing(
    bad: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = PolicyCatalog.load()

    def no_open(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"opened {args!r}")

    monkeypatch.setattr(builtins, "open", no_open)
    monkeypatch.setattr(Path, "open", no_open)
    with pytest.raises(InvalidArgumentError) as caught:
        catalog.get(bad)
    assert str(caught.value) == "policy must be the name of a policy"


def test_an_unknown_name_is_unknown_policy() -> None:
    with pytest.raises(UnknownPolicyError, match="unknown policy 'nosuch'") as caught:
        PolicyCatalog.load().get("nosuch")
    assert caught.value.code == "invalid_argument"


def test_a_broken_file_answers_its_own_error_and_the_others_load(tmp_path: Path) -> None:
    (tmp_path / "broken.toml").write_text("[timeouts\n")
    (tmp_path / "mine.toml").write_text('extends = "default"\n')
    catalog = PolicyCatalog.load([tmp_path])
    assert catalog.get("mine").name == "mine"
    with pytest.raises(PolicyFileError, match="not valid TOML"):
        catalog.get("broken")
    with pytest.raises(PolicyFileError):
        catalog.require({"default", "broken"})


def test_a_fifo_in_a_policy_directory_is_not_read(tmp_path: Path) -> None:
    """Reading it would block until a writer came; loading returns at once without it."""
    os.mkfifo(tmp_path / "trap.toml")
    catalog = PolicyCatalog.load([tmp_path])
    assert "trap" not in catalog.names()
    with pytest.raises(UnknownPolicyError):
        catalog.get("trap")


def test_a_file_whose_stem_is_not_a_name_is_not_served(tmp_path: Path) -> None:
    (tmp_path / "Not A Name.toml").write_text('extends = "default"\n')
    assert PolicyCatalog.load([tmp_path]).names() == shipped_policy_names()


def test_none_is_the_default_which_may_be_the_operators_own_file(tmp_path: Path) -> None:
    assert PolicyCatalog.load().get(None).name == "default"
    mine = tmp_path / "mine.toml"
    mine.write_text('extends = "strict"\nname = "operators"\n')
    catalog = PolicyCatalog.load(default=mine)
    assert catalog.get(None).name == "operators"
    with pytest.raises(InvalidArgumentError, match="must be the name"):
        catalog.get(str(mine))
