"""Picking an egress network's subnet from the operator's pool: pure logic (the engine's side,
with real networks, is tests/docker/test_egress_subnets.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.backend.docker import EgressSettings
from orchestrator.backend.docker._egress_net import removal_order
from orchestrator.backend.docker._egress_subnets import check_pool, free_subnets, halves
from orchestrator.errors import InvalidArgumentError


def test_the_pool_is_carved_in_address_order_around_the_engines_networks() -> None:
    taken = ["172.17.0.0/16", "10.9.0.16/28", "10.9.0.40/29", "not a subnet", "fd00::/64"]
    assert list(itertools.islice(free_subnets("10.9.0.0/26", taken), 10)) == [
        "10.9.0.0/28",
        "10.9.0.48/28",
    ]


def test_a_network_wider_than_the_pool_takes_all_of_it() -> None:
    assert list(free_subnets("192.168.5.0/24", ["192.168.0.0/16"])) == []


@pytest.mark.parametrize("pool", ["10.0.0.0/29", "10.0.0.1/24", "fd12::/64", "pypi.org", ""])
def test_a_pool_that_cannot_hold_one_network_is_refused(pool: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        check_pool(pool)
    with pytest.raises(InvalidArgumentError, match="egress subnet pool"):
        EgressSettings(subnet_pool=pool)


@settings(deadline=None)  # a property, not a timing: a loaded machine took 400 ms for one case
@given(
    st.lists(
        st.tuples(st.integers(0, 255), st.integers(20, 32)).map(lambda t: f"10.77.{t[0]}.0/{t[1]}"),
        max_size=12,
    )
)
def test_no_subnet_given_overlaps_a_taken_one_or_leaves_the_pool(taken: list[str]) -> None:
    import ipaddress

    pool = ipaddress.ip_network("10.77.0.0/20")
    used = [ipaddress.ip_network(t, strict=False) for t in taken]
    given_out = [ipaddress.ip_network(s) for s in free_subnets(str(pool), taken)]
    assert all(s.subnet_of(pool) and s.prefixlen == 28 for s in given_out)
    assert not any(s.overlaps(u) for s in given_out for u in used)


def test_the_operator_sets_the_pool_and_the_upstream_network_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SANDHOLD_EGRESS_SUBNETS", raising=False)
    monkeypatch.delenv("SANDHOLD_EGRESS_NETWORK", raising=False)
    assert EgressSettings.from_env() == EgressSettings()
    monkeypatch.setenv("SANDHOLD_EGRESS_SUBNETS", "10.213.0.0/16")
    monkeypatch.setenv("SANDHOLD_EGRESS_NETWORK", "egress-out")
    assert EgressSettings.from_env() == EgressSettings(
        upstream_network="egress-out", subnet_pool="10.213.0.0/16"
    )
    monkeypatch.setenv("SANDHOLD_EGRESS_SUBNETS", "10.213.0.0/30")
    with pytest.raises(InvalidArgumentError, match="smaller than one egress network"):
        EgressSettings.from_env()


def test_a_sessions_subnet_is_split_between_its_network_and_its_link() -> None:
    assert halves("10.9.0.16/28") == ("10.9.0.16/29", "10.9.0.24/29")


@pytest.mark.parametrize("name", ["sandhold-egress-", "sandhold-test-internet", "upstream", "zz"])
def test_an_upstream_network_that_sorts_after_the_session_networks_is_refused(name: str) -> None:
    """Docker would give the proxy its default route from the session network (which leads
    nowhere): the first by name of a container's networks that are not internal."""
    with pytest.raises(InvalidArgumentError, match="sorts after the session networks") as caught:
        EgressSettings(upstream_network=name)
    assert caught.value.error_type == "invalid_argument" and caught.value.hint


def test_a_session_network_is_removed_before_the_link_it_sits_on() -> None:
    found = [{"Id": "l", "Driver": "bridge"}, {"Id": "s", "Driver": "macvlan"}]
    assert [n["Id"] for n in removal_order(found)] == ["s", "l"]
