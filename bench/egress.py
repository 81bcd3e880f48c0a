"""What the egress proxy costs, against the same traffic without it, in one run; prints JSON.

    .venv/bin/python bench/egress.py [--requests 200] [--download-mb 100] [--runtime runsc]

A web server on a Docker network of this script's own (no traffic leaves the machine). The
same client script runs twice: in a container on that network, straight to the server
(``direct``), and in a session of mode ``open`` whose only way out is its egress proxy
(``proxy``). Figures:

- ``request``: one HTTP GET of a tiny body on a new connection (urllib), sequential, p50/p90;
- ``download``: one GET of ``--download-mb`` MiB, MiB/s;
- ``create``: creating and starting the session container, with egress (network, proxy) and
  without (mode ``none``), a few of each;
- ``proxy_memory_mib``: the proxy container's memory, idle and right after the run.

``--runtime runsc`` runs the sessions and the direct client under gVisor (the direct one under
the runtime a session with egress gets: ``runsc-egress`` where runsc is ``--network=none``).
"""

from __future__ import annotations

import argparse
import json
import platform
import secrets
import time
from typing import Any

import anyio
import docker
from _stats import summary

from orchestrator.backend.base import ContainerSpec, ExecSpec
from orchestrator.backend.docker import DockerBackend, DockerClient, EgressSettings
from orchestrator.backend.docker._spec import egress_runtimes
from orchestrator.images import ensure_worker_image
from orchestrator.policy.model import Policy

LABELS = {"sandhold.bench": "egress"}
CREATES = 5

SERVER = r"""
import http.server
CHUNK = b"x" * 65536
class Serve(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        size = int(self.path.strip("/") or 0)
        self.send_response(200); self.send_header("Content-Length", str(size)); self.end_headers()
        while size > 0:
            self.wfile.write(CHUNK[:size]); size -= len(CHUNK)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 80), Serve).serve_forever()
"""

CLIENT = r"""
import json, sys, time, urllib.request
n, mb = int(sys.argv[1]), int(sys.argv[2])
opener = urllib.request.build_opener()
for _ in range(20):
    opener.open("http://web.test/0", timeout=10).read()
samples = []
for _ in range(n):
    t = time.perf_counter(); opener.open("http://web.test/0", timeout=10).read()
    samples.append(time.perf_counter() - t)
t = time.perf_counter(); got = 0
with opener.open(f"http://web.test/{mb << 20}", timeout=120) as r:
    while chunk := r.read(1 << 20):
        got += len(chunk)
print(json.dumps({"samples": samples, "download_s": time.perf_counter() - t, "bytes": got}))
"""


def _policy(mode: str, runtime: str | None) -> Policy:
    return Policy.model_validate(
        {"name": "bench-egress", "network": {"mode": mode}, "runtime": runtime}
    )


async def _client_run(backend: DockerBackend, container_id: str, n: int, mb: int) -> dict[str, Any]:
    result = await backend.run(
        container_id,
        ExecSpec(argv=["python3", "-c", CLIENT, str(n), str(mb)]),
        timeout=600,
        max_output_bytes=1 << 22,
    )
    if result.exit_code != 0:
        raise RuntimeError(result.stderr.decode()[-2000:])
    raw = json.loads(result.stdout)
    return {
        "request": summary(raw["samples"]),
        "download_mib_s": round(raw["bytes"] / (1 << 20) / raw["download_s"], 1),
    }


async def main(n: int, mb: int, runtime: str | None) -> dict[str, Any]:
    client = DockerClient()
    image = (await ensure_worker_image(client)).tag
    sdk = docker.from_env(timeout=60)
    direct_runtime = runtime
    if runtime is not None:
        direct_runtime = egress_runtimes(sdk.info().get("Runtimes") or {}).get(runtime, runtime)
    name = f"sandhold-bench-egress-{secrets.token_hex(4)}"
    network = sdk.networks.create(name, driver="bridge", labels=LABELS)
    made: list[Any] = []
    backend = None
    sessions: list[str] = []
    try:
        web = sdk.containers.create(image, ["python3", "-c", SERVER], labels=LABELS, network=name)
        made.append(web)
        network.disconnect(web)
        network.connect(web, aliases=["web.test"])
        web.start()
        direct = sdk.containers.run(
            image, ["sleep", "600"], labels=LABELS, network=name, detach=True,
            runtime=direct_runtime,
        )  # fmt: skip
        made.append(direct)
        web.reload()
        web_ip = web.attrs["NetworkSettings"]["Networks"][name]["IPAddress"]
        settings = EgressSettings(upstream_network=name, permit_cidrs=(f"{web_ip}/32",))
        backend = DockerBackend(client, egress=settings)

        create: dict[str, list[float]] = {"open": [], "none": []}
        for mode in ("none", "open") * CREATES:
            spec = ContainerSpec(
                image=image,
                policy=_policy(mode, runtime),
                session_id=secrets.token_hex(16),
                tenant="bench",
                orchestrator_id="bench-egress",
                extra_labels=LABELS,
            )
            started = time.perf_counter()
            sessions.append(await backend.create_container(spec))
            create[mode].append(time.perf_counter() - started)
        sandbox = sessions[-1]
        session_id = (await backend.inspect(sandbox))["Config"]["Labels"]["sandhold.session"]
        proxy = sdk.containers.list(filters={"label": f"sandhold.egress-session={session_id}"})[0]
        idle = (await backend.stats(proxy.id))["memory_bytes"]

        via_direct = await _client_run(DockerBackend(client), direct.id, n, mb)
        via_proxy = await _client_run(backend, sandbox, n, mb)
        busy = (await backend.stats(proxy.id))["memory_bytes"]
        return {
            "bench": "egress",
            "python": platform.python_version(),
            "runtime": runtime or "runc",
            "requests": n,
            "download_mib": mb,
            "direct": via_direct,
            "proxy": via_proxy,
            "added_request_p50_ms": round(
                via_proxy["request"]["p50_ms"] - via_direct["request"]["p50_ms"], 3
            ),
            "create": {mode: summary(samples) for mode, samples in create.items()},
            "proxy_memory_mib": {
                "idle": round(idle / (1 << 20), 1),
                "after_run": round(busy / (1 << 20), 1),
            },
        }
    finally:
        with anyio.CancelScope(shield=True):
            if backend is not None:
                for container_id in sessions:
                    await backend.remove_container(container_id)
            for container in made:
                container.remove(force=True)
            network.remove()
            sdk.close()
            await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--download-mb", type=int, default=100)
    parser.add_argument("--runtime", choices=["runsc"], default=None)
    args = parser.parse_args()
    print(json.dumps(anyio.run(main, args.requests, args.download_mb, args.runtime), indent=2))
