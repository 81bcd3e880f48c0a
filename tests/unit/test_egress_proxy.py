"""The egress proxy's pure parts, on the host: rules, the address check, the ClientHello reader,
the log reader, plain HTTP's request head and body framing, and the policy's network section.
Real TLS hellos come from the stdlib's own client (an SSLObject over memory BIOs); hypothesis
feeds the parsers what a sandbox could send."""

from __future__ import annotations

import contextlib
import json
import ssl

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.backend.network_log import parse_log
from orchestrator.policy.model import NetworkConfig
from orchestrator.worker.egress_proxy import (
    Refused,
    address_refused,
    body_framing,
    chunk_size,
    client_hello_sni,
    match_rule,
    plain_request_head,
    split_host_port,
)

ALLOW = ["pypi.org", "*.pythonhosted.org", "github.com:22"]


@pytest.mark.parametrize(
    ("host", "port", "rule"),
    [
        ("pypi.org", 443, "pypi.org"),
        ("pypi.org", 80, "pypi.org"),
        ("pypi.org", 8443, None),
        ("files.pythonhosted.org", 443, "*.pythonhosted.org"),
        ("pythonhosted.org", 443, None),
        ("evilpythonhosted.org", 443, None),
        ("github.com", 22, "github.com:22"),
        ("github.com", 443, None),
        ("pypi.org.evil.com", 443, None),
    ],
)
def test_a_rule_names_a_host_or_its_subdomains_and_ports_80_and_443_unless_it_names_one(
    host: str, port: int, rule: str | None
) -> None:
    assert match_rule("allowlist", ALLOW, host, port) == rule


def test_open_mode_matches_every_name() -> None:
    assert match_rule("open", [], "example.com", 8080) == "open"


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.17.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "fd00:ec2::254",
        "::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "224.0.0.251",
        "100.64.0.1",
        "0.0.0.0",
        "fe80::1",
    ],
)
def test_loopback_private_link_local_multicast_and_metadata_are_refused(address: str) -> None:
    assert address_refused(address, [])


@pytest.mark.parametrize(
    "address",
    [
        "::7f00:1",  # IPv4-compatible: 127.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible: 169.254.169.254
        "::808:808",  # IPv4-compatible with a public IPv4: deprecated, outside global unicast
        "::ffff:0:7f00:1",  # IPv4-translated: 127.0.0.1
        "::ffff:0:a00:1",  # IPv4-translated: 10.0.0.1
        "::ffff:0:808:808",  # IPv4-translated, public: outside global unicast
        "64:ff9b::a9fe:a9fe",  # NAT64 well-known prefix: 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64: 127.0.0.1
        "64:ff9b::808:808",  # NAT64 with a public IPv4: outside global unicast
        "64:ff9b:1::a00:1",  # NAT64 local-use prefix
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2002:808:808::1",  # 6to4 of a public IPv4: the 6to4 block itself is special-purpose
        "2001:0:7f00:1::1",  # Teredo whose server is 127.0.0.1
        "2001:0:808:808::80ff:fef5",  # Teredo whose client is 127.0.1.10 (stored inverted)
        "2001:0:808:808::f7f7:f7f7",  # Teredo between public IPv4s: the block is refused
        "2001:2::1",  # benchmarking
        "2001:20::1",  # ORCHIDv2
        "2001:db8::1",  # documentation
        "3fff::1",  # documentation (2024)
        "5f00::1",  # SRv6 segment identifiers
        "2620:4f:8000::1",  # AS112
        "100::1",  # discard-only
        "::",  # unspecified
        "ff0e::1",  # global multicast
        "fec0::1",  # site-local (deprecated), outside global unicast
        "4000::1",  # unassigned, outside global unicast
    ],
)
def test_ipv6_outside_global_unicast_special_purpose_or_carrying_ipv4_is_refused(
    address: str,
) -> None:
    assert address_refused(address, [])


def test_an_ipv6_form_carrying_a_refused_ipv4_is_refused_even_in_a_permitted_ipv6_range() -> None:
    import ipaddress

    nat64 = [ipaddress.ip_network("64:ff9b::/96")]  # an operator's NAT64, permitted
    assert not address_refused("64:ff9b::808:808", nat64)
    assert address_refused("64:ff9b::7f00:1", nat64)
    assert address_refused("64:ff9b::a9fe:a9fe", nat64)
    sixtofour = [ipaddress.ip_network("2002::/16")]
    assert address_refused("2002:a00:1::1", sixtofour)
    # A permitted IPv4 range is reached by its IPv4-mapped form too (a dual-stack resolver).
    internet = [ipaddress.ip_network("172.18.0.0/16")]
    assert not address_refused("::ffff:172.18.0.5", internet)
    assert address_refused("::ffff:172.19.0.5", internet)


def test_a_public_address_passes_and_a_permitted_range_passes_but_never_the_metadata_one() -> None:
    import ipaddress

    assert not address_refused("8.8.8.8", [])
    assert not address_refused("2606:4700::1111", [])
    assert not address_refused("2001:4860:4860::8888", [])  # 2001:4860:: is not 2001::/23
    assert not address_refused("::ffff:8.8.8.8", [])
    permit = [ipaddress.ip_network("172.18.0.0/16"), ipaddress.ip_network("169.254.0.0/16")]
    assert not address_refused("172.18.0.5", permit)
    assert address_refused("169.254.169.254", permit)
    assert address_refused("172.19.0.5", permit)


def _client_hello(server_hostname: str | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_the_sni_of_a_real_client_hello_is_read_and_a_hello_without_one_has_none() -> None:
    assert client_hello_sni(_client_hello("Files.PythonHosted.org")) == "files.pythonhosted.org"
    assert client_hello_sni(_client_hello(None)) is None


def test_a_first_record_that_is_not_a_client_hello_is_refused() -> None:
    with pytest.raises(Refused) as caught:
        client_hello_sni(b"GET / HTTP/1.1\r\n\r\n")
    assert caught.value.rule == "not_tls"
    hello = _client_hello("pypi.org")
    with pytest.raises(Refused) as caught:
        client_hello_sni(hello[:60])
    assert caught.value.rule == "tls_unparsed"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_give_a_name_none_or_a_refusal(data: bytes) -> None:
    try:
        result = client_hello_sni(data)
    except Refused:
        return
    assert result is None or isinstance(result, str)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=400))
def test_a_real_hello_mutated_gives_a_name_none_or_a_refusal(noise: bytes, at: int) -> None:
    hello = bytearray(_client_hello("pypi.org"))
    hello[at : at + len(noise)] = noise
    with contextlib.suppress(Refused):
        client_hello_sni(bytes(hello))


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_any_connect_target_gives_a_host_and_port_or_a_refusal(target: str) -> None:
    try:
        host, port = split_host_port(target, 443)
    except Refused as refused:
        status = refused.status
    else:
        status = 200
        assert 0 < port < 65536 and host and host == host.lower()
    assert status in (200, 400)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("pypi.org:443", ("pypi.org", 443)),
        ("PyPI.org.", ("pypi.org", 443)),
        ("[::1]:8080", ("::1", 8080)),
        ("example.com:80", ("example.com", 80)),
    ],
)
def test_connect_targets_are_normalized(target: str, expected: tuple[str, int]) -> None:
    assert split_host_port(target, 443) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_the_log_reader_keeps_only_well_formed_entries(data: bytes) -> None:
    for entry in parse_log(data):
        assert entry["decision"] in ("allow", "deny")


def test_the_log_reader_keeps_each_entry_once_oldest_first_and_drops_a_forged_one() -> None:
    def line(seq: int, **extra: object) -> bytes:
        entry = {"seq": seq, "time": 1.0, "method": "GET", "host": "a.test", "port": 80,
                 "decision": "allow", "rule": "a.test", "bytes_sent": 1, "bytes_received": 2,
                 "duration_s": 0.1, **extra}  # fmt: skip
        return json.dumps(entry).encode()

    data = b"\n".join([line(2), line(1), line(2), line(3, decision="maybe"), b"{", line(4, x=1)])
    assert [e["seq"] for e in parse_log(data)] == [1, 2]


@pytest.mark.parametrize(
    "network",
    [
        {"mode": "open", "allow": ["pypi.org"]},
        {"mode": "allowlist", "allow": ["PyPI.org"]},
        {"mode": "allowlist", "allow": ["*."]},
        {"mode": "allowlist", "allow": ["10.0.0.1"]},
        {"mode": "allowlist", "allow": ["localhost"]},
        {"mode": "allowlist", "allow": ["pypi.org:0"]},
        {"mode": "proxy"},
    ],
)
def test_a_network_section_the_proxy_could_not_honour_is_refused(
    network: dict[str, object],
) -> None:
    with pytest.raises(pydantic.ValidationError):
        NetworkConfig.model_validate(network)


@pytest.mark.parametrize(
    ("new", "within"),
    [
        (["pypi.org"], True),
        (["pypi.org:443"], True),
        (["pypi.org:8080"], False),
        (["files.pythonhosted.org"], True),
        (["*.cdn.pythonhosted.org"], True),
        (["*.pythonhosted.org"], True),
        (["pythonhosted.org"], False),
        (["github.com:22"], True),
        (["github.com"], False),
        (["example.com"], False),
        (["pypi.org", "example.com"], False),
    ],
)
def test_a_live_allowlist_is_refused_when_any_rule_is_wider_than_the_policy(
    new: list[str], within: bool
) -> None:
    from orchestrator.errors import PolicyViolationError
    from orchestrator.policy.egress import narrowed_allowlist

    policy = NetworkConfig(mode="allowlist", allow=ALLOW)
    if within:
        assert narrowed_allowlist(policy, new) == new
    else:
        with pytest.raises(PolicyViolationError) as caught:
            narrowed_allowlist(policy, new)
        assert caught.value.rule == "network.allow"


def test_a_live_allowlist_is_anything_under_open_nothing_under_none_and_checked_rules() -> None:
    from orchestrator.errors import InvalidArgumentError, PolicyViolationError
    from orchestrator.policy.egress import narrowed_allowlist

    assert narrowed_allowlist(NetworkConfig(mode="open"), ["a.test", "a.test"]) == ["a.test"]
    with pytest.raises(PolicyViolationError):
        narrowed_allowlist(NetworkConfig(), ["a.test"])
    with pytest.raises(InvalidArgumentError):
        narrowed_allowlist(NetworkConfig(mode="open"), ["10.0.0.1"])


@pytest.mark.parametrize(
    ("policy", "cap", "capped"),
    [
        # The policy's rules the cap covers, and the cap's rules the policy covers.
        (ALLOW, ["pypi.org:443", "*.pythonhosted.org"], ["*.pythonhosted.org", "pypi.org:443"]),
        (ALLOW, ["files.pythonhosted.org", "github.com"], ["files.pythonhosted.org"]),
        (["*.github.com"], ["api.github.com:443", "*.github.com:443"], ["*.github.com:443"]),
        (ALLOW, ["example.com"], []),
        (None, ["example.com", "example.com"], ["example.com"]),  # open: the cap itself
    ],
)
def test_a_tenants_cap_keeps_only_what_both_it_and_the_policy_allow(
    policy: list[str] | None, cap: list[str], capped: list[str]
) -> None:
    from orchestrator.policy.egress import capped_allowlist

    network = (
        NetworkConfig(mode="open")
        if policy is None
        else NetworkConfig(mode="allowlist", allow=policy)
    )
    assert capped_allowlist(network, cap) == capped
    assert capped_allowlist(network, None) is None
    assert capped_allowlist(NetworkConfig(), cap) is None  # mode none: nothing to cap


def test_a_live_allowlist_stays_within_the_tenants_cap_as_well_as_the_policy() -> None:
    from orchestrator.errors import PolicyViolationError
    from orchestrator.policy.egress import narrowed_allowlist

    network = NetworkConfig(mode="open")
    assert narrowed_allowlist(network, ["pypi.org:443"], ["pypi.org"]) == ["pypi.org:443"]
    with pytest.raises(PolicyViolationError) as caught:
        narrowed_allowlist(network, ["example.com"], ["pypi.org"])
    assert caught.value.rule == "tenant.egress_allow"


def test_a_tenants_cap_in_the_tenants_file_is_checked_as_rules() -> None:
    from orchestrator._core.tenants import TenantConfig

    key = "0" * 64
    made = TenantConfig(name="t", key_sha256=key, egress_allow=["pypi.org", "pypi.org"])
    assert made.egress_allow == ("pypi.org",)
    for bad in ("10.0.0.1", "PyPI.org", "pypi.org:0"):  # a policy's syntax, no addresses
        with pytest.raises(pydantic.ValidationError, match="egress_allow"):
            TenantConfig(name="t", key_sha256=key, egress_allow=[bad])


def test_a_plain_request_goes_up_with_the_checked_host_and_without_connection_headers() -> None:
    head = plain_request_head(
        "GET", "/simple/", "HTTP/1.1", "pypi.org",
        ["Host: evil.example", "Proxy-Authorization: Basic eA==", "Connection: keep-alive",
         "HOST : other.example", "Upgrade: h2c", "Accept: */*"],
    )  # fmt: skip
    assert head == (
        b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("headers", "framing"),
    [
        ([], 0),
        (["Content-Length: 12"], 12),
        (["content-length:  7 ", "Content-Length: 7"], 7),
        (["Transfer-Encoding: chunked"], None),
    ],
)
def test_a_request_body_is_framed_by_its_one_length_or_by_chunks(
    headers: list[str], framing: int | None
) -> None:
    assert body_framing(headers) == framing


@pytest.mark.parametrize(
    "headers",
    [
        ["Content-Length: 5", "Transfer-Encoding: chunked"],  # the classic smuggling pair
        ["Content-Length: 5", "Content-Length: 6"],
        ["Content-Length: -1"],
        ["Content-Length: 0x10"],
        ["Transfer-Encoding: gzip, chunked"],
        ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
    ],
)
def test_a_request_whose_body_framing_is_ambiguous_is_refused(headers: list[str]) -> None:
    with pytest.raises(Refused) as caught:
        body_framing(headers)
    assert (caught.value.rule, caught.value.status) == ("bad_request", 400)


def test_a_chunk_size_line_is_hex_with_optional_extensions() -> None:
    assert chunk_size(b"1a\r\n") == 26
    assert chunk_size(b"0;name=value\r\n") == 0
    for bad in (b"\r\n", b"-1\r\n", b"zz\r\n", b"1" * 16 + b"\r\n"):
        with pytest.raises(ValueError, match="chunk size"):
            chunk_size(bad)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=6))
def test_any_headers_give_a_framing_or_a_refusal(headers: list[str]) -> None:
    try:
        framing = body_framing(headers)
    except Refused:
        return
    assert framing is None or 0 <= framing < 10**15


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40))
def test_any_chunk_line_gives_a_size_or_a_value_error(line: bytes) -> None:
    try:
        size = chunk_size(line + b"\r\n")
    except ValueError:
        return
    assert 0 <= size < 16**15
