"""Egress by name against real containers, with no traffic leaving this machine: the test builds
a small "internet" on a Docker network of its own (a web server answering HTTP on 80 and TLS on
443 under the names ``allowed.test`` and ``other.test``, and a second container, ``private.test``,
whose address the proxies are not permitted), and lets the proxies reach only the web server's
address (``EgressSettings.permit_cidrs``, an operator setting no policy can make).

Sandboxes run Python's urllib, which reads ``HTTP(S)_PROXY`` as pip and curl do.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import secrets
import subprocess
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import docker
import pip
import pytest

from orchestrator.backend.base import ContainerSpec, ExecSpec
from orchestrator.backend.docker import DockerBackend, DockerClient, EgressSettings
from orchestrator.backend.docker._spec import egress_runtimes
from orchestrator.docs_reference._results import RESULTS
from orchestrator.policy.model import Policy
from tests.conftest import IN_CI, RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL

pytestmark = pytest.mark.anyio

WHEEL_NAME = "hello_egress-1.0-py3-none-any.whl"
WEB_SERVER = (
    f"WHEEL_NAME = {WHEEL_NAME!r}\n"
    + r"""
import base64, hashlib, http.server, os, ssl, threading
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        wheel = base64.b64decode(os.environ["WHEEL"])
        if self.path.startswith("/simple/"):  # a PEP 503 index of one project
            digest = hashlib.sha256(wheel).hexdigest()
            # As PyPI does: the index on pypi.org, the files on files.pythonhosted.org.
            host = "https://files.pythonhosted.org" if self.headers["Host"] == "pypi.org" else ""
            body = f'<a href="{host}/files/{WHEEL_NAME}#sha256={digest}">{WHEEL_NAME}</a>'.encode()
        elif self.path == f"/files/{WHEEL_NAME}":
            body = wheel
        else:
            size = int(self.path.strip("/") or 0)
            body = ("hello " + self.headers.get("Host", "") + " " + "x" * size).encode()
        self.send_response(200)
        if self.path.startswith("/simple/"):
            self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):  # the body as the server read it, de-chunked by hand
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size); self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        reply = b"posted " + body
        self.send_response(200); self.send_header("Content-Length", str(len(reply)))
        self.end_headers(); self.wfile.write(reply)
    def log_message(self, *a): pass
for name in ("cert", "key"):
    open(f"/tmp/{name}.pem", "w").write(os.environ[name.upper()])
plain = http.server.ThreadingHTTPServer(("0.0.0.0", 80), Hello)
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 443), Hello)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain("/tmp/cert.pem", "/tmp/key.pem")
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
plain.serve_forever()
"""
)

# What a sandbox runs: fetch a URL through the proxy its environment names; print one JSON line.
FETCH = r"""
import json, ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile="/tmp/ca.pem") if len(sys.argv) > 2 else None
try:
    with urllib.request.urlopen(sys.argv[1], timeout=15, context=ctx) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()[:60]}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "rule": e.headers.get("X-Sandhold-Egress-Rule")}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "text": str(e)[:200]}))
"""


# The web server's names: PyPI's two among them, so that the shipped pip policy is tested as it
# ships, against this machine's "internet" (the proxies resolve through its network's DNS).
WEB_NAMES = ["allowed.test", "other.test", "pypi.test", "pypi.org", "files.pythonhosted.org"]
SUBJECT_ALT_NAMES = "subjectAltName=" + ",".join(f"DNS:{name}" for name in WEB_NAMES)


def _self_signed(folder: Path) -> tuple[str, str]:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=allowed.test", "-addext", SUBJECT_ALT_NAMES,
         "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return (folder / "cert.pem").read_text(), (folder / "key.pem").read_text()


def _wheel_b64() -> str:
    """A one-module wheel, made here: what pip installs in the test."""
    files = {
        "hello_egress/__init__.py": b"VALUE = 42\n",
        "hello_egress-1.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: hello-egress\nVersion: 1.0\n"
        ),
        "hello_egress-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(
        f"{name},sha256={_urlsafe_digest(data)},{len(data)}\n" for name, data in files.items()
    )
    files["hello_egress-1.0.dist-info/RECORD"] = (
        record + "hello_egress-1.0.dist-info/RECORD,,\n"
    ).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return base64.b64encode(buffer.getvalue()).decode()


def _urlsafe_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _pip_zipapp() -> bytes:
    """pip from this interpreter's site-packages as a zip Python runs: the images carry no pip."""
    root = Path(pip.__file__).parent
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            "__main__.py", "import sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"
        )
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, Path("pip") / path.relative_to(root))
    return buffer.getvalue()


class Internet:
    def __init__(self, network: str, web_ip: str, cert: str) -> None:
        self.network = network
        self.web_ip = web_ip
        self.cert = cert


@pytest.fixture(scope="module")
def internet(worker_image: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    environment = {"CERT": cert, "KEY": key, "WHEEL": _wheel_b64()}
    sdk = docker.from_env(timeout=30)
    labels = {TEST_RUN_LABEL: RUN_ID}
    # Before "sandhold-egress-" by name, as an upstream network must be (the proxies' default
    # route: ``_egress_net.upstream_problem``).
    name = f"sandhold-dmz-internet-{RUN_ID}"
    network = sdk.networks.create(name, driver="bridge", labels=labels)
    started = []
    try:
        for aliases, command in (
            (WEB_NAMES, ["python3", "-c", WEB_SERVER]),
            (["private.test"], ["sleep", "infinity"]),
        ):
            container = sdk.containers.create(
                worker_image.tag, command, labels=labels, environment=environment,
                detach=True, network=name,
            )  # fmt: skip
            started.append(container)
            network.disconnect(container)
            network.connect(container, aliases=aliases)
            container.start()
        started[0].reload()
        web_ip = started[0].attrs["NetworkSettings"]["Networks"][name]["IPAddress"]
        yield Internet(name, web_ip, cert)
    finally:
        for container in started:
            container.remove(force=True)
        network.remove()
        sdk.close()


@pytest.fixture(scope="module")
def own_upstream() -> Iterator[str]:
    """An upstream network of the test's own, for tests that send nothing upstream: they do not
    depend on the engine's default bridge (docker0)."""
    sdk = docker.from_env(timeout=30)
    name = f"sandhold-dmz-upstream-{RUN_ID}-{secrets.token_hex(3)}"  # before "sandhold-egress-"
    network = sdk.networks.create(name, driver="bridge", labels={TEST_RUN_LABEL: RUN_ID})
    try:
        yield name
    finally:
        network.remove()
        sdk.close()


@pytest.fixture
async def egress_backend(internet: Internet) -> AsyncIterator[DockerBackend]:
    client = DockerClient()
    settings = EgressSettings(
        upstream_network=internet.network, permit_cidrs=(f"{internet.web_ip}/32",)
    )
    try:
        yield DockerBackend(client, egress=settings)
    finally:
        await client.aclose()


class Sandbox:
    def __init__(self, backend: DockerBackend, container_id: str, session_id: str) -> None:
        self.backend, self.id, self.session_id = backend, container_id, session_id

    async def python(self, code: str, *args: str) -> str:
        result = await self.backend.run(
            self.id, ExecSpec(argv=["python3", "-c", code, *args]), timeout=60,
            max_output_bytes=1 << 20,
        )  # fmt: skip
        return result.stdout.decode() + result.stderr.decode()

    async def upload(self, path: str, data: bytes) -> None:
        stream = await self.backend.open_exec(
            self.id,
            ExecSpec(
                argv=[
                    "python3",
                    "-c",
                    f"import sys; open({path!r}, 'wb').write(sys.stdin.buffer.read())",
                ]
            ),
        )
        try:
            await stream.send(data)
            await stream.send_eof()
            with anyio.fail_after(60):
                while await stream.receive() is not None:
                    pass
        finally:
            await stream.aclose()

    async def fetch(self, url: str, *, verify: bool = False) -> dict[str, Any]:
        out = await self.python(FETCH, url, *(["verify"] if verify else []))
        return dict(json.loads(out.strip().splitlines()[-1]))


def _runsc_without_egress() -> str | None:
    """Why runsc cannot run a session with a network on this engine, None when it can: runsc
    registered with ``--network=none`` (this machine's is) needs a ``runsc-egress`` sibling."""
    sdk = docker.from_env(timeout=30)
    try:
        registered = sdk.info().get("Runtimes") or {}
    finally:
        sdk.close()
    if "runsc" in egress_runtimes(registered) and egress_runtimes(registered)["runsc"] is None:
        return "runsc is registered with --network=none and there is no runsc-egress runtime"
    return None


@pytest.fixture(params=[None, "runsc"], ids=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest) -> str | None:
    """Every sandbox test runs under runc and under gVisor. Under runsc: skipped where the
    engine has no runsc at all, failed under CI when it has one that cannot run a session
    with a network (``.ci/install-runsc`` registers both), skipped with the reason elsewhere."""
    if request.param is None:
        return None
    request.getfixturevalue("runsc_works")
    if (problem := _runsc_without_egress()) is not None:
        if IN_CI:
            pytest.fail(f"CI is set and {problem} (.ci/install-runsc registers it)", pytrace=False)
        pytest.skip(problem)
    return "runsc"


@pytest.fixture
async def sandbox(
    egress_backend: DockerBackend, worker_image: Any, internet: Internet, runtime: str | None
) -> AsyncIterator[Any]:
    made: list[str] = []

    async def make(network: dict[str, Any]) -> Sandbox:
        policy = Policy.model_validate(
            {"name": "egress-test", "network": network, "runtime": runtime}
        )
        session_id = secrets.token_hex(16)
        spec = ContainerSpec(
            image=worker_image.tag, policy=policy, session_id=session_id, tenant="test",
            orchestrator_id=TEST_ORCHESTRATOR_ID, extra_labels={TEST_RUN_LABEL: RUN_ID},
        )  # fmt: skip
        with anyio.fail_after(120):  # gVisor's start on a loaded machine
            container_id = await egress_backend.create_container(spec)
        made.append(container_id)
        box = Sandbox(egress_backend, container_id, session_id)
        await box.python(f"open('/tmp/ca.pem', 'w').write({internet.cert!r})")
        return box

    try:
        yield make
    finally:
        with anyio.CancelScope(shield=True):
            for container_id in made:
                await egress_backend.remove_container(container_id)


def _runtime_of(container_id: str) -> str:
    sdk = docker.from_env(timeout=30)
    try:
        return str(sdk.api.inspect_container(container_id)["HostConfig"]["Runtime"])
    finally:
        sdk.close()


def _egress_of(session_id: str) -> tuple[list[Any], list[Any]]:
    sdk = docker.from_env(timeout=30)
    try:
        label = {"label": f"sandhold.egress-session={session_id}"}
        return sdk.api.containers(all=True, filters=label), sdk.api.networks(filters=label)
    finally:
        sdk.close()


async def test_an_allowed_name_is_reached_over_http_and_tls_and_another_is_refused_with_its_rule(
    sandbox: Any,
) -> None:
    box = await sandbox({"mode": "allowlist", "allow": ["allowed.test"]})
    assert await box.fetch("http://allowed.test/") == {"status": 200, "body": "hello allowed.test "}
    assert (await box.fetch("https://allowed.test/", verify=True))["status"] == 200
    assert await box.fetch("http://other.test/") == {"status": 403, "rule": "allowlist"}
    denied = await box.fetch("https://other.test/", verify=True)
    assert denied["error"] == "URLError" and "403" in denied["text"]
    # A port the rule does not name (none given: 80 and 443 only).
    assert (await box.fetch("http://allowed.test:8080/"))["rule"] == "allowlist"
    log = await box.backend.network_log(box.id)
    seen = [(e["method"], e["host"], e["port"], e["decision"], e["rule"]) for e in log]
    assert seen == [
        ("GET", "allowed.test", 80, "allow", "allowed.test"),
        ("CONNECT", "allowed.test", 443, "allow", "allowed.test"),
        ("GET", "other.test", 80, "deny", "allowlist"),
        ("CONNECT", "other.test", 443, "deny", "allowlist"),
        ("GET", "allowed.test", 8080, "deny", "allowlist"),
    ]
    assert log[0]["bytes_sent"] > 0 and log[0]["bytes_received"] > len("hello allowed.test ")
    assert log[1]["bytes_received"] > 1000  # the TLS handshake and the reply came through


async def test_a_name_that_resolves_to_a_private_address_is_refused_in_open_mode_too(
    sandbox: Any,
) -> None:
    box = await sandbox({"mode": "open"})
    assert (await box.fetch("http://allowed.test/"))["status"] == 200
    assert await box.fetch("http://private.test/") == {"status": 403, "rule": "private_address"}
    assert (await box.fetch("http://169.254.169.254/latest/meta-data/"))["rule"] == (
        "private_address"
    )
    assert (await box.fetch("http://127.0.0.1.nip.invalid/"))["rule"] == "dns"


async def test_a_tls_hello_whose_sni_differs_from_the_connect_host_is_refused(
    sandbox: Any,
) -> None:
    box = await sandbox({"mode": "allowlist", "allow": ["allowed.test"]})
    code = r"""
import base64, os, socket, ssl, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
s = socket.create_connection((proxy.hostname, proxy.port), timeout=15)
head = f"CONNECT allowed.test:443 HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
s.sendall(head.encode())
print(s.recv(1024).split(b"\r\n")[0].decode())
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
try:
    ctx.wrap_socket(s, server_hostname="other.test")
    print("handshake completed")
except (OSError, ssl.SSLError) as e:
    print("handshake failed")
"""
    out = (await box.python(code)).split("\n")
    assert out[:2] == ["HTTP/1.1 200 Connection established", "handshake failed"]
    log = await box.backend.network_log(box.id)
    assert [(e["host"], e["decision"], e["rule"]) for e in log] == [
        ("allowed.test", "deny", "sni_mismatch")
    ]


RAW_HTTP = r"""
import base64, os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
s = socket.create_connection((proxy.hostname, proxy.port), timeout=15)
s.sendall(sys.argv[1].replace("AUTH", auth).encode())
reply = b""
while data := s.recv(65536):
    reply += data
print(reply.decode("latin-1"))
"""


async def test_plain_http_goes_up_with_the_checked_host_one_request_per_connection(
    sandbox: Any,
) -> None:
    box = await sandbox({"mode": "allowlist", "allow": ["allowed.test"]})
    auth = "Proxy-Authorization: Basic AUTH\r\n"
    # A Host naming another site on the checked address, and a second request pipelined behind
    # the first: the server sees the checked name, and only the first request.
    forged = (
        f"GET http://allowed.test/ HTTP/1.1\r\nHost: other.test\r\n{auth}\r\n"
        f"GET http://allowed.test/3 HTTP/1.1\r\nHost: other.test\r\n{auth}\r\n"
    )
    reply = await box.python(RAW_HTTP, forged)
    assert reply.count("HTTP/1.0 200") == 1 and "hello allowed.test " in reply, reply
    assert "other.test" not in reply and "xxx" not in reply
    chunked = (
        f"POST http://allowed.test/ HTTP/1.1\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n"
        f"GET http://allowed.test/ HTTP/1.1\r\n{auth}\r\n"
    )
    reply = await box.python(RAW_HTTP, chunked)
    assert reply.count("HTTP/1.0 200") == 1 and reply.endswith("posted hello world\n"), reply
    sized = f"POST http://allowed.test/ HTTP/1.1\r\n{auth}Content-Length: 4\r\n\r\nbodyEXTRA"
    assert (await box.python(RAW_HTTP, sized)).endswith("posted body\n")
    smuggled = (
        f"POST http://allowed.test/ HTTP/1.1\r\n{auth}Content-Length: 4\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    assert (await box.python(RAW_HTTP, smuggled)).startswith("HTTP/1.1 400")
    log = await box.backend.network_log(box.id)
    assert [(e["method"], e["decision"], e["rule"]) for e in log] == [
        ("GET", "allow", "allowed.test"),
        ("POST", "allow", "allowed.test"),
        ("POST", "allow", "allowed.test"),
        ("POST", "deny", "bad_request"),
    ]


async def test_without_the_session_credential_the_proxy_answers_407(sandbox: Any) -> None:
    box = await sandbox({"mode": "open"})
    code = r"""
import os, urllib.parse, urllib.request
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
opener = urllib.request.build_opener(urllib.request.ProxyHandler(
    {"http": f"http://sandbox:wrong@{proxy.hostname}:{proxy.port}"}))
try:
    opener.open("http://allowed.test/", timeout=15)
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("X-Sandhold-Egress-Rule"))
"""
    assert (await box.python(code)).strip() == "407 auth"


async def test_the_sandbox_has_no_route_and_no_resolver_only_the_proxy(
    sandbox: Any, internet: Internet, runtime: str | None
) -> None:
    box = await sandbox({"mode": "open"})
    if runtime == "runsc":  # where runsc is registered --network=none, its sibling runs it
        sdk = docker.from_env(timeout=30)
        try:
            sibling = egress_runtimes(sdk.info().get("Runtimes") or {}).get("runsc")
        finally:
            sdk.close()
        assert _runtime_of(box.id) == (sibling or "runsc")
    assert (await box.fetch("http://allowed.test/"))["status"] == 200
    (proxy,), _ = _egress_of(box.session_id)
    upstream_side = proxy["NetworkSettings"]["Networks"][internet.network]["IPAddress"]
    # The web server, the proxy's own address on its upstream network, the metadata service,
    # the host's bridge gateway, a public resolver: none has a route from the sandbox. A refused
    # connection would be an answer (from the host's kernel or another's), so only no answer or
    # no route counts (every host address: test_egress_host_reach).
    code = r"""
import errno, socket, sys
for host, port in [(sys.argv[1], 80), (sys.argv[2], 3128), ("169.254.169.254", 80),
                   ("172.17.0.1", 80), ("8.8.8.8", 53)]:
    try:
        socket.create_connection((host, port), timeout=2); print("connected", host)
    except TimeoutError:
        print("unreached", host, "timeout")
    except OSError as e:
        name = errno.errorcode.get(e.errno, str(e.errno))
        unrouted = name in ("EHOSTUNREACH", "ENETUNREACH")
        print("unreached" if unrouted else "answered", host, name)
for name in ["allowed.test", "pypi.org"]:
    try:
        socket.getaddrinfo(name, 80); print("resolved", name)
    except OSError:
        print("unresolved", name)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.settimeout(2)
try:
    udp.sendto(b"\x12\x34\x01\x00\x00\x01" + bytes(6) + b"\x04test\x00\x00\x01\x00\x01",
               ("8.8.8.8", 53))
    udp.recv(512); print("connected dns")
except TimeoutError:
    print("unreached dns timeout")
except OSError as e:
    name = errno.errorcode.get(e.errno, str(e.errno))
    print("unreached" if name in ("EHOSTUNREACH", "ENETUNREACH") else "answered", "dns", name)
"""
    lines = (await box.python(code, internet.web_ip, upstream_side)).strip().split("\n")
    assert sum(line.startswith("unreached") for line in lines) == 6, lines
    assert sum(line.startswith("unresolved") for line in lines) == 2, lines


async def test_a_session_in_mode_none_has_only_loopback_and_no_egress(
    sandbox: Any, runtime: str | None
) -> None:
    box = await sandbox({"mode": "none"})
    assert _runtime_of(box.id) == (runtime or "runc")  # never the egress sibling
    names = await box.python("import socket; print(sorted(n for _, n in socket.if_nameindex()))")
    assert names.strip() == "['lo']"
    assert _egress_of(box.session_id) == ([], [])
    assert await box.backend.network_log(box.id) == []


async def test_the_proxy_and_network_go_with_their_session_and_a_stray_one_is_reaped(
    sandbox: Any, egress_backend: DockerBackend
) -> None:
    box = await sandbox({"mode": "open"})
    proxies, networks = _egress_of(box.session_id)
    assert len(proxies) == 1 and sorted(n["Driver"] for n in networks) == ["bridge", "macvlan"]
    assert proxies[0]["Labels"]["sandhold.egress-orchestrator"] == TEST_ORCHESTRATOR_ID
    await egress_backend.remove_container(box.id)
    assert _egress_of(box.session_id) == ([], [])
    # A backend that did not create it (a later start reaping a dead orchestrator's sessions)
    # finds the egress from the container's labels.
    adopted = await sandbox({"mode": "open"})
    later = DockerBackend(egress_backend.client, egress=egress_backend.egress)
    await later.remove_container(adopted.id)
    assert _egress_of(adopted.session_id) == ([], [])
    # Left behind (its session container removed behind the backend's back, as a kill -9 of
    # sandhold and a removal by hand would): the reconciler's sweep removes it.
    other = await sandbox({"mode": "open"})
    fresh = DockerBackend(egress_backend.client, egress=egress_backend.egress)
    sdk = docker.from_env(timeout=30)
    try:
        sdk.api.remove_container(other.id, force=True)
    finally:
        sdk.close()
    assert len(_egress_of(other.session_id)[0]) == 1
    # And a network whose proxy is gone as well (a run killed between the two removals).
    lone = secrets.token_hex(16)
    sdk = docker.from_env(timeout=30)
    try:
        sdk.networks.create(
            f"sandhold-egress-{lone}", internal=True, labels={
                "sandhold.egress-session": lone,
                "sandhold.egress-orchestrator": TEST_ORCHESTRATOR_ID,
                TEST_RUN_LABEL: RUN_ID,
            },
        )  # fmt: skip
    finally:
        sdk.close()
    reaped = await fresh.reap_egress(TEST_ORCHESTRATOR_ID, set())
    assert reaped == sorted([other.session_id, lone])
    assert _egress_of(other.session_id) == ([], [])
    assert _egress_of(lone) == ([], [])


LAB_POLICY = """
extends = "shell"
name = "egress-lab"
[network]
mode = "allowlist"
allow = ["allowed.test"]
"""
FETCH_IN_REPL = """
import urllib.request, urllib.error
def fetch(url):
    try:
        return urllib.request.urlopen(url, timeout=15).read().decode()
    except urllib.error.HTTPError as e:
        return e.code
"""


async def test_through_the_tools_a_refused_attempt_is_in_the_calls_result_and_in_the_log(
    worker_image: Any, egress_backend: DockerBackend, tmp_path: Path
) -> None:
    from orchestrator._api import Orchestrator, OrchestratorConfig

    (tmp_path / "egress-lab.toml").write_text(LAB_POLICY)
    config = OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        extra_labels={TEST_RUN_LABEL: RUN_ID},
        policy_dirs=(tmp_path,),
        audit_dir=tmp_path / "audit",
    )
    async with Orchestrator(config, backend=egress_backend) as orch:
        with anyio.fail_after(120):
            first = await orch.call(
                "python_repl",
                {"operation": "execute", "code": FETCH_IN_REPL, "policy": "egress-lab"},
            )
            sid = first.structured["session_id"]
            ok = await orch.call(
                "python_repl",
                {
                    "operation": "execute",
                    "session_id": sid,
                    "code": "fetch('http://allowed.test/')",
                },
            )
            assert ok.structured["result_repr"] == repr("hello allowed.test ")
            assert "network_denied" not in ok.structured
            refused = await orch.call(
                "python_repl",
                {"operation": "execute", "session_id": sid, "code": "fetch('http://other.test/')"},
            )
            assert refused.structured["result_repr"] == "403"
            assert refused.structured["network_denied"] == [
                {"host": "other.test", "port": 80, "rule": "allowlist"}
            ]
            shell = await orch.call(
                "terminal",
                {
                    "operation": "run",
                    "session_id": sid,
                    "command": "python3 -c \"import urllib.request as u; u.urlopen('http://private.test:8080/')\"",
                },
            )
            assert shell.structured["network_denied"] == [
                {"host": "private.test", "port": 8080, "rule": "allowlist"}
            ]
            log = await orch.call("session", {"operation": "network_log", "session_id": sid})
            entries = log.structured["entries"]
            assert [(e["host"], e["decision"]) for e in entries] == [
                ("allowed.test", "allow"),
                ("other.test", "deny"),
                ("private.test", "deny"),
            ]
            assert log.structured["denied"] == 2
            narrowed = await orch.call(
                "session",
                {"operation": "set_allowlist", "session_id": sid, "allow": ["other.test"]},
            )
            assert narrowed.structured["success"] is False
            assert narrowed.structured["error_type"] == "policy"
            kept = await orch.call(
                "session",
                {"operation": "set_allowlist", "session_id": sid, "allow": ["allowed.test:80"]},
            )
            assert kept.structured["allow"] == ["allowed.test:80"]
            shape = RESULTS["session.set_allowlist"]
            assert set(kept.structured) == set(shape.added) | {"success", "operation"}
    # Each call's record counts the attempts that ended during it, with their bytes; a call
    # that made none carries no egress field.
    records = [
        json.loads(line)
        for segment in sorted((tmp_path / "audit").glob("audit-*.jsonl"))
        for line in segment.read_text().splitlines()
    ]
    calls = [r for r in records if r["kind"] == "call"]
    tallies = [(r["tool"], r["operation"], r.get("egress")) for r in calls]
    assert [t[:2] for t in tallies][:4] == [
        ("python_repl", "execute"), ("python_repl", "execute"), ("python_repl", "execute"),
        ("terminal", "run"),
    ]  # fmt: skip
    assert tallies[0][2] is None
    allowed, denied, shell = (t[2] for t in tallies[1:4])
    assert allowed is not None and denied is not None and shell is not None
    assert (allowed["attempts"], allowed["denied"]) == (1, 0)
    assert allowed["bytes_sent"] > 0 and allowed["bytes_received"] > len("hello allowed.test ")
    assert (denied["attempts"], denied["denied"], denied["bytes_received"]) == (1, 1, 0)
    assert (shell["attempts"], shell["denied"]) == (1, 1)
    assert all(t[2] is None for t in tallies[4:])


PIP = [
    "python3", "/tmp/pip.pyz", "install", "--index-url", "https://pypi.test/simple",
    "--cert", "/tmp/ca.pem", "--target", "/workspace/site", "--no-cache-dir",
    "--disable-pip-version-check", "--retries", "0", "--timeout", "10", "hello-egress",
]  # fmt: skip


async def test_pip_installs_from_an_allowed_index_and_is_refused_by_name_elsewhere(
    sandbox: Any,
) -> None:
    zipapp = _pip_zipapp()
    allowed = await sandbox({"mode": "allowlist", "allow": ["pypi.test:443"]})
    await allowed.upload("/tmp/pip.pyz", zipapp)
    result = await allowed.backend.run(
        allowed.id, ExecSpec(argv=PIP), timeout=180, max_output_bytes=1 << 20
    )
    assert result.exit_code == 0, result.stdout.decode()[-2000:] + result.stderr.decode()[-2000:]
    imported = await allowed.python(
        "import sys; sys.path.insert(0, '/workspace/site'); import hello_egress; "
        "print(hello_egress.VALUE)"
    )
    assert imported.strip() == "42"
    log = await allowed.backend.network_log(allowed.id)
    assert {(e["method"], e["host"], e["decision"]) for e in log} == {
        ("CONNECT", "pypi.test", "allow")
    }

    refused = await sandbox({"mode": "allowlist", "allow": ["allowed.test"]})
    await refused.upload("/tmp/pip.pyz", zipapp)
    result = await refused.backend.run(
        refused.id, ExecSpec(argv=PIP), timeout=180, max_output_bytes=1 << 20
    )
    assert result.exit_code != 0
    denied = await refused.backend.network_log(refused.id)
    assert {(e["host"], e["port"], e["decision"], e["rule"]) for e in denied} == {
        ("pypi.test", 443, "deny", "allowlist")
    }


async def test_the_shipped_pip_policy_installs_from_pypi_by_name_for_the_shell_and_the_repl(
    worker_image: Any, egress_backend: DockerBackend, internet: Internet
) -> None:
    """``policy: "pip"`` as shipped (its template, its allowlist of PyPI's two names): pip's
    defaults reach the index and the files host; the package imports in the shell and in the
    REPL; any other name is refused."""
    from orchestrator._api import Orchestrator, OrchestratorConfig

    config = OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        extra_labels={TEST_RUN_LABEL: RUN_ID},
    )
    async with Orchestrator(config, backend=egress_backend) as orch:
        with anyio.fail_after(600):  # the first use builds the pip template
            made = await orch.call("session", {"operation": "create", "policy": "pip"})
            assert made.structured["success"], made.structured
            sid = made.structured["session_id"]
            cert = {"path": "ca.pem", "content": internet.cert}
            wrote = await orch.call("files", {"operation": "write", "session_id": sid, **cert})
            assert wrote.structured["success"], wrote.structured
            installed = await orch.call(
                "terminal",
                {
                    "operation": "run", "session_id": sid, "timeout_s": 180,
                    "command": "python3 -m pip install --cert ca.pem --progress-bar off "
                    "--disable-pip-version-check hello-egress && python3 -c "
                    "'import hello_egress; print(\"value\", hello_egress.VALUE)'",
                },
            )  # fmt: skip
            out = installed.structured["stdout"]
            assert installed.structured["exit_code"] == 0, out
            assert "Successfully installed hello-egress-1.0" in out and "value 42" in out, out
            assert "network_denied" not in installed.structured
            repl = await orch.call(
                "python_repl",
                {"operation": "execute", "session_id": sid, "code": "import hello_egress\n"
                 "hello_egress.VALUE, hello_egress.__file__.startswith('/home/')"},
            )  # fmt: skip
            assert repl.structured["result_repr"] == "(42, True)", repl.structured
            refused = await orch.call(
                "terminal",
                {"operation": "run", "session_id": sid, "timeout_s": 120,
                 "command": "python3 -m pip install --cert ca.pem --index-url "
                 "https://pypi.test/simple --retries 0 hello-egress==2"},
            )  # fmt: skip
            assert refused.structured["exit_code"] != 0
            assert refused.structured["network_denied"] == [
                {"host": "pypi.test", "port": 443, "rule": "allowlist"}
            ]
            log = await orch.call("session", {"operation": "network_log", "session_id": sid})
            allowed = {(e["host"], e["rule"]) for e in log.structured["entries"]
                       if e["decision"] == "allow"}  # fmt: skip
            assert allowed == {
                ("pypi.org", "pypi.org:443"),
                ("files.pythonhosted.org", "files.pythonhosted.org:443"),
            }


async def test_a_live_allowlist_change_applies_to_the_next_connection_and_never_widens(
    sandbox: Any,
) -> None:
    from orchestrator.errors import PolicyViolationError
    from orchestrator.policy.egress import narrowed_allowlist

    both = {"mode": "allowlist", "allow": ["allowed.test", "other.test"]}
    box = await sandbox(both)
    assert (await box.fetch("http://other.test/"))["status"] == 200
    policy = Policy.model_validate({"name": "egress-test", "network": both})
    await box.backend.set_egress_allow(box.id, narrowed_allowlist(policy.network, ["allowed.test"]))
    assert (await box.fetch("http://allowed.test/"))["status"] == 200
    assert await box.fetch("http://other.test/") == {"status": 403, "rule": "allowlist"}
    with pytest.raises(PolicyViolationError):
        narrowed_allowlist(policy.network, ["example.com"])
    await box.backend.set_egress_allow(box.id, [])
    assert (await box.fetch("http://allowed.test/"))["rule"] == "allowlist"


async def test_past_its_byte_limit_a_session_is_cut_off_and_then_refused(sandbox: Any) -> None:
    box = await sandbox({"mode": "open", "max_mb": 1})
    cut = await box.fetch(f"http://allowed.test/{2 << 20}")
    assert cut["error"] == "IncompleteRead"  # the body stopped short: the proxy closed it
    assert await box.fetch("http://allowed.test/") == {"status": 503, "rule": "limit.bytes"}
    log = await box.backend.network_log(box.id)
    assert log[0]["rule"] == "open (closed: limit.bytes)"
    assert (1 << 20) <= log[0]["bytes_received"] < 2 << 20
    assert (log[1]["decision"], log[1]["rule"]) == ("deny", "limit.bytes")


async def test_past_its_connection_limit_a_new_connection_is_refused(sandbox: Any) -> None:
    box = await sandbox({"mode": "open", "max_connections": 1})
    code = FETCH.replace("try:\n    with", "held = hold()\ntry:\n    with", 1)
    hold = r"""
import base64, os, socket, urllib.parse
def hold():
    proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
    auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=15)
    head = f"CONNECT allowed.test:443 HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    s.sendall(head.encode())
    assert s.recv(1024).startswith(b"HTTP/1.1 200")
    return s
"""
    out = await box.python(hold + code, "http://allowed.test/")
    assert json.loads(out.strip().splitlines()[-1]) == {"status": 503, "rule": "limit.connections"}
