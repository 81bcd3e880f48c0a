"""E2B's network options (``allow_internet_access``, ``network={allow_out, deny_out, ...}``)
onto sandhold's egress, driven by E2B's own SDK against a real ``sandhold serve --e2b-port``,
tried as an attacker in the sandbox would: a sandbox made with ``allow_internet_access=False``
connects to no listener of the host's (on any of its addresses, directly or through its
proxy) and gets nothing through its proxy; ``allow_out`` names are all the sandbox reaches;
what sandhold cannot honour (IP and CIDR rules, a deny-list, a name the policy does not allow)
is refused and leaves no session behind. The ``pip`` template (a policy with an allowlist of
PyPI) is the networked one: ``base`` has no network at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import docker
import pytest
from e2b import Sandbox, SandboxException

from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.backend.docker import DockerClient
from orchestrator.images import ImageBuildResult
from orchestrator.images.progress import NullProgress
from orchestrator.images.template_build import (
    TEMPLATE_BUILD_TIMEOUT,
    TemplateImage,
    ensure_template_image,
)
from orchestrator.images.templates import load_catalog
from tests.docker.e2b_server import E2bServer, e2b_server
from tests.docker.test_egress_host_reach import (
    PROBE,
    PROBE_THREADS,
    UNREACHED,
    UNREACHED_IPV6,
    host_addresses,
    listen,
)

__all__ = ["listen"]  # the fixture, from test_egress_host_reach

pytestmark = pytest.mark.docker

CONNECT_TIMEOUT_S = 1.5
# What the sandbox's own proxy (the environment's HTTPS_PROXY, as pip or curl use it) answers a
# CONNECT to each target: its status and the rule it names (X-Sandhold-Egress-Rule), read from the
# proxy's head: ``allowlist`` is the rule of a name not allowed; any other answer is past it.
CONNECT = r"""
import base64, json, os, socket, sys, urllib.parse
proxy = os.environ.get("HTTPS_PROXY")
out = {}
for target in sys.argv[1:]:
    if not proxy:
        out[target] = "no proxy"
        continue
    url = urllib.parse.urlsplit(proxy)
    auth = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
    try:
        with socket.create_connection((url.hostname, url.port), timeout=20) as conn:
            conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
                         f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
            head = conn.recv(4096).decode("latin-1").split("\r\n")
    except OSError as exc:
        out[target] = f"error {exc}"
        continue
    rule = [h.split(":", 1)[1].strip() for h in head if h.lower().startswith("x-sandhold-egress")]
    out[target] = f"{head[0].split()[1]} {rule[0] if rule else ''}".strip()
print(json.dumps(out))
"""
PYPI = "pypi.org:443"
FILES = "files.pythonhosted.org:443"
# Past the allowlist: connected (a machine on the internet), or refused only after the name
# passed it, for the reserved address this machine resolves PyPI to or a name that does not
# resolve. "403 allowlist" is the one answer that means the name was not allowed.
ALLOWED_BY_NAME = {"200", "403 private_address", "403 dns"}


@pytest.fixture(scope="module")
def pip_template(worker_image: ImageBuildResult) -> TemplateImage:
    """Built before the server starts: a first use's build can outlast the SDK's create."""

    async def build() -> TemplateImage:
        client = DockerClient()
        try:
            with anyio.fail_after(TEMPLATE_BUILD_TIMEOUT):
                return await ensure_template_image(
                    client, load_catalog(), "pip", base_tag=worker_image.tag,
                    progress=NullProgress(),
                )  # fmt: skip
        finally:
            await client.aclose()

    return anyio.run(build)


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult,
    pip_template: TemplateImage,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-network")) as running:
        yield running


def _sessions(server: E2bServer) -> int:
    sdk = docker.from_env(timeout=30)
    try:
        label = f"{LABEL_ORCHESTRATOR}={server.orchestrator_id}"
        return sum(
            1
            for c in sdk.containers.list(all=True, filters={"label": label})
            if "sandhold.egress-session" not in c.labels
        )
    finally:
        sdk.close()


def _connect(sandbox: Sandbox, *targets: str) -> dict[str, str]:
    sandbox.files.write("connect.py", CONNECT)
    ran = sandbox.commands.run("python3 connect.py " + " ".join(targets), timeout=120)
    return dict(json.loads(ran.stdout.strip().splitlines()[-1]))


def _probe(sandbox: Sandbox, targets: list[tuple[str, int]]) -> list[str]:
    # A sandbox with no network has no interface but loopback: its probe names that one.
    no_link = 'next(name for _, name in socket.if_nameindex() if name != "lo")'
    assert no_link in PROBE
    probe = PROBE.replace(no_link, no_link.replace("next(name", "next((name")[:-1] + '), "lo")')
    sandbox.files.write("probe.py", probe)
    argument = json.dumps([targets, [], CONNECT_TIMEOUT_S, PROBE_THREADS]).replace("'", "")
    ran = sandbox.commands.run(f"python3 probe.py '{argument}'", timeout=300)
    return list(json.loads(ran.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("template", ["base", "pip"])
def test_no_internet_access_reaches_no_host_listener_and_nothing_through_the_proxy(
    server: E2bServer, listen: Any, template: str
) -> None:
    sandbox = Sandbox.create(template, allow_internet_access=False)
    try:
        addresses = [a for a in host_addresses() if not a.loopback]
        listeners = listen(addresses)
        wildcard = listeners.port(listeners.wildcard_tcp)
        targets = [(a.address, listeners.port(listeners.tcp[a.address])) for a in addresses]
        targets += [(a.address, wildcard) for a in addresses]
        outcomes = _probe(sandbox, targets)
        for (host, port), outcome in zip(targets, outcomes, strict=True):
            allowed = UNREACHED_IPV6 if ":" in host else UNREACHED
            assert outcome in allowed, (host, port, outcome)
        # Through the proxy too (the environment's HTTPS_PROXY, when there is one): neither the
        # policy's own hosts nor the host's addresses.
        proxied = [PYPI, FILES] + [f"{h}:{p}" for h, p in targets if ":" not in h]
        answered = _connect(sandbox, *proxied)
        expected = "no proxy" if template == "base" else "403 allowlist"
        assert set(answered.values()) == {expected}, answered
        assert listeners.heard() == []
    finally:
        sandbox.kill()


def test_internet_access_by_default_is_the_policys_own(server: E2bServer) -> None:
    sandbox = Sandbox.create("pip", allow_internet_access=True)
    try:
        answered = _connect(sandbox, PYPI, "example.com:443")
        assert answered[PYPI] in ALLOWED_BY_NAME, answered
        assert answered["example.com:443"] == "403 allowlist"  # not in the policy: never widened
    finally:
        sandbox.kill()


def test_allow_out_names_are_all_the_sandbox_reaches(server: E2bServer) -> None:
    sandbox = Sandbox.create(
        "pip", network={"allow_out": ["pypi.org:443"], "deny_out": lambda ctx: [ctx.all_traffic]}
    )
    try:
        answered = _connect(sandbox, PYPI, FILES)
        assert answered[PYPI] in ALLOWED_BY_NAME, answered
        assert answered[FILES] == "403 allowlist"  # in the policy, not in allow_out
    finally:
        sandbox.kill()


@pytest.mark.parametrize(
    ("template", "options", "refusal"),
    [
        ("pip", {"network": {"allow_out": ["1.1.1.1"]}}, "by host name only"),
        ("pip", {"network": {"allow_out": ["10.0.0.0/8"]}}, "by host name only"),
        ("pip", {"network": {"deny_out": ["8.8.8.8"]}}, "cannot be denied alone"),
        ("pip", {"network": {"dns_servers": ["1.1.1.1"]}}, "dnsServers"),
        ("pip", {"network": {"mask_request_host": "${PORT}-x.example"}}, "not supported"),
        # Wider than the policy: a name it does not allow, or any name without a network.
        ("pip", {"network": {"allow_out": ["example.com"]}}, "not within the session's policy"),
        ("pip", {"network": {"allow_out": ["pypi.org"]}}, "not within the session's policy"),
        ("base", {"network": {"allow_out": ["pypi.org:443"]}}, "network mode none"),
        (
            "pip",
            {"allow_internet_access": False, "network": {"allow_out": ["pypi.org:443"]}},
            "say one or the other",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_and_leaves_no_session(
    server: E2bServer, template: str, options: dict[str, Any], refusal: str
) -> None:
    before = _sessions(server)
    with pytest.raises(SandboxException, match=refusal):
        Sandbox.create(template, **options)
    assert Sandbox.list().next_items() == []
    assert _sessions(server) == before
