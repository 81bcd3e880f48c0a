"""Which runtime a session with egress runs under, from ``docker info``'s ``Runtimes``: pure
logic (the real engine's case is tests/docker/test_egress.py, under runc and runsc)."""

from __future__ import annotations

from typing import Any

from orchestrator.backend.docker._spec import egress_runtimes

OFFLINE = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}


def test_an_offline_runtime_uses_its_egress_sibling_when_the_sibling_has_a_network() -> None:
    registered: dict[str, Any] = {
        "runc": {"path": "runc"},
        "runsc": OFFLINE,
        "runsc-egress": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host"]},
    }
    assert egress_runtimes(registered) == {"runsc": "runsc-egress"}


def test_an_offline_runtime_without_a_sibling_or_with_an_offline_one_has_none() -> None:
    assert egress_runtimes({"runsc": OFFLINE}) == {"runsc": None}
    assert egress_runtimes({"runsc": OFFLINE, "runsc-egress": OFFLINE}) == {"runsc": None}


def test_a_runtime_with_a_network_is_used_as_it_is() -> None:
    registered: dict[str, Any] = {"runc": {"path": "runc"}, "runsc": {"path": "/usr/bin/runsc"}}
    assert egress_runtimes(registered) == {}
    assert egress_runtimes({"runsc": {"runtimeArgs": None}, "kata": None}) == {}
