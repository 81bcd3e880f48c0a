"""The Kubernetes backend beside Docker, in the same run; prints JSON.

    .venv/bin/python bench/kubernetes.py [--rounds 300]

Needs the cluster of ``.ci/kube-cluster start`` (its admin kubeconfig and the worker image it
imported). For each backend, through the public Python API:

- ``execute_1p1``: ``execute("1+1")`` on an existing session (the REPL worker's round trip);
- ``raw_stream_echo``: one line through an attached exec running ``cat`` (the floor of a request
  over an attached stream: Docker's attach socket, or the API server's websocket through the
  relay in the Pod);
- ``one_shot_exec``: ``true`` run to completion (an exec per call);
- ``cold_session``: create a session (a container or a Pod, and a ready worker) and destroy it.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator._core.config import BackendConfig
from orchestrator.backend.base import ExecSpec

RUN = Path("/run/sandhold-kube")
KUBERNETES = {
    "kubeconfig": str(RUN / "admin.kubeconfig"),
    "namespace": "default",
    "seccomp_profile": "localhost/sandhold.json",
    "pod_pids_limit": 256,
    "network_isolated": True,
}
# A Pod takes a second or more to start: fewer cold rounds than warm ones.
COLD_ROUNDS = 5


async def timed(rounds: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


async def measure(config: OrchestratorConfig, rounds: int) -> dict[str, Any]:
    async with Orchestrator(config) as orch:
        first = await orch.execute("0")
        sid = first.session_id
        container = orch.find_session(sid).container_id

        async def execute() -> None:
            assert (await orch.execute("1+1", session_id=sid)).result_repr == "2"

        stream = await orch.backend.open_exec(container, ExecSpec(argv=["cat"]))

        async def echo() -> None:
            await stream.send(b"ping\n")
            assert await stream.receive() is not None

        async def one_shot() -> None:
            await orch.backend.run(
                container, ExecSpec(argv=["true"]), timeout=30, max_output_bytes=64
            )

        async def cold() -> None:
            made = await orch.execute("1")
            await orch.destroy(made.session_id)

        await timed(20, execute)
        figures = {
            "execute_1p1": summary(await timed(rounds, execute)),
            "raw_stream_echo": summary(await timed(rounds, echo)),
            "one_shot_exec": summary(await timed(max(rounds // 10, 10), one_shot)),
        }
        await stream.aclose()
        await orch.destroy(sid)
        figures["cold_session"] = summary(await timed(COLD_ROUNDS, cold))
        return figures


async def main(rounds: int) -> dict[str, Any]:
    image = (RUN / "worker-image").read_text().strip()
    docker = OrchestratorConfig(image=image, extra_labels={"sandhold.bench": "kubernetes"})
    kubernetes = OrchestratorConfig(
        image=image, backend=BackendConfig(name="kubernetes", options=KUBERNETES)
    )
    return {
        "docker": await measure(docker, rounds),
        "kubernetes": await measure(kubernetes, rounds),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    print(json.dumps(anyio.run(main, parser.parse_args().rounds), indent=2))
