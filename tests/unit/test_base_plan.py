"""How the base image is chosen: every branch of ``plan_base`` with the commands it would run."""

from __future__ import annotations

import pytest

from orchestrator.images.base_plan import (
    APT_INSTALL_DEBOOTSTRAP,
    APT_UPDATE,
    PINNED_PYTHON_IMAGE,
    Debootstrap,
    HostTools,
    NoWayHere,
    Pull,
    UseLocal,
    plan_base,
)
from orchestrator.images.debootstrap import base_tag

ROOT_WITH_DEBOOTSTRAP = HostTools(
    debootstrap="/usr/sbin/debootstrap", apt_get="/usr/bin/apt-get", is_root=True
)
ROOT_WITH_APT = HostTools(debootstrap=None, apt_get="/usr/bin/apt-get", is_root=True)
ROOT_WITHOUT_APT = HostTools(debootstrap=None, apt_get=None, is_root=True)
NOT_ROOT = HostTools(debootstrap="/usr/sbin/debootstrap", apt_get="/usr/bin/apt-get", is_root=False)


def plan(
    tools: HostTools,
    *,
    local: frozenset[str] = frozenset(),
    given: str | None = None,
    given_is_local: bool = False,
):
    return plan_base(
        given=given, given_is_local=given_is_local, local=local, suite="bookworm", tools=tools
    )


def test_an_engine_that_can_pull_gets_the_pinned_official_image_first() -> None:
    candidates = plan(ROOT_WITH_DEBOOTSTRAP)
    assert candidates[0] == Pull(PINNED_PYTHON_IMAGE)
    assert "@sha256:" in PINNED_PYTHON_IMAGE


def test_when_the_pull_fails_and_debootstrap_is_present_it_bootstraps_without_installing() -> None:
    assert plan(ROOT_WITH_DEBOOTSTRAP) == (Pull(PINNED_PYTHON_IMAGE), Debootstrap("bookworm"))


def test_a_missing_debootstrap_is_installed_with_apt_get_when_root() -> None:
    last = plan(ROOT_WITH_APT)[-1]
    assert last == Debootstrap("bookworm", install=(APT_UPDATE, APT_INSTALL_DEBOOTSTRAP))
    assert APT_UPDATE == ("apt-get", "update", "-q")
    assert APT_INSTALL_DEBOOTSTRAP == (
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "debootstrap",
    )


@pytest.mark.parametrize(
    ("tools", "fix"),
    [(NOT_ROOT, "sudo sandhold image build"), (ROOT_WITHOUT_APT, "--base-image")],
)
def test_with_neither_the_last_step_is_an_error_naming_the_fix(tools: HostTools, fix: str) -> None:
    last = plan(tools)[-1]
    assert isinstance(last, NoWayHere)
    error = last.error()
    assert error.code == "invalid_argument"
    assert fix in (error.hint or "")


def test_an_image_the_engine_has_is_used_without_pulling() -> None:
    assert plan(ROOT_WITH_APT, local=frozenset({base_tag("bookworm")})) == (
        UseLocal(base_tag("bookworm")),
    )
    both = frozenset({base_tag("bookworm"), PINNED_PYTHON_IMAGE})
    assert plan(NOT_ROOT, local=both) == (UseLocal(PINNED_PYTHON_IMAGE),)


def test_a_given_base_is_used_when_local_and_pulled_first_otherwise() -> None:
    assert plan(NOT_ROOT, given="mine:1", given_is_local=True) == (UseLocal("mine:1"),)
    candidates = plan(ROOT_WITH_DEBOOTSTRAP, given="mine:1")
    assert candidates == (Pull("mine:1"), Pull(PINNED_PYTHON_IMAGE), Debootstrap("bookworm"))
