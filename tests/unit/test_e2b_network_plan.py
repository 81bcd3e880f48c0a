"""E2B's network options mapped onto sandhold's egress (``orchestrator.http.e2b._network``):
what each create body becomes, and every option sandhold cannot honour refused with a message
naming it (never ignored, never wider than asked)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import InvalidArgumentError
from orchestrator.http.e2b._network import ALL_TRAFFIC, MAX_RULES, EgressPlan, egress_plan


@pytest.mark.parametrize(
    ("body", "allow"),
    [
        ({}, None),
        ({"allow_internet_access": True}, None),
        ({"allow_internet_access": True, "network": {"allowPublicTraffic": False}}, None),
        ({"network": {"allowPublicTraffic": True}}, None),
        ({"allow_internet_access": False}, []),
        ({"network": {"denyOut": [ALL_TRAFFIC]}}, []),
        ({"allow_internet_access": False, "network": {"denyOut": [ALL_TRAFFIC]}}, []),
        ({"network": {"allowOut": ["pypi.org:443"], "denyOut": [ALL_TRAFFIC]}}, ["pypi.org:443"]),
        # Alone, allowOut is still all the sandbox reaches (E2B would allow the rest too).
        ({"network": {"allowOut": ["a.example", "a.example", "*.b.example"]}},
         ["a.example", "*.b.example"]),
        ({"network": {"dnsServers": []}}, None),
    ],
)  # fmt: skip
def test_each_body_becomes_its_plan(body: dict[str, Any], allow: list[str] | None) -> None:
    assert egress_plan(body) == EgressPlan(allow=allow)


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ({"allow_internet_access": "no"}, "allow_internet_access must be true or false"),
        ({"network": []}, "network must be an object"),
        ({"network": {"allowOut": "pypi.org"}}, "allowOut must be a list of strings"),
        ({"network": {"allowOut": [1]}}, "allowOut must be a list of strings"),
        ({"network": {"allowOut": ["x.example"] * (MAX_RULES + 1)}}, "more than"),
        ({"network": {"allowOut": ["1.1.1.1"]}}, "by host name only"),
        ({"network": {"allowOut": ["8.8.8.0/24"]}}, "by host name only"),
        ({"network": {"allowOut": ["::1"]}}, "by host name only"),
        ({"network": {"denyOut": ["8.8.8.8"]}}, "cannot be denied alone"),
        ({"network": {"denyOut": [ALL_TRAFFIC, "evil.example"]}}, "cannot be denied alone"),
        ({"network": {"dnsServers": ["1.1.1.1"]}}, "dnsServers"),
        ({"network": {"rules": {"a.example": []}}}, "transform rules"),
        ({"network": {"egressProxy": {"address": "p:1080"}}}, "egress proxy"),
        ({"network": {"maskRequestHost": "${PORT}-x.example"}}, "host mask"),
        ({"network": {"httpsPorts": [3000]}}, "HTTPS ports"),
        ({"network": {"allowPublicTraffic": "yes"}}, "allowPublicTraffic must be"),
        ({"allow_internet_access": False, "network": {"allowOut": ["pypi.org"]}},
         "say one or the other"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused_by_name(body: dict[str, Any], refusal: str) -> None:
    with pytest.raises(InvalidArgumentError, match=refusal):
        egress_plan(body)
