"""Cold start, parallel start and teardown against a bare ``docker run`` of the same image, in
the same run; prints JSON (issue 21.1-21.2).

    .venv/bin/python bench/cold_start.py [--rounds 10] [--parallel 10]

- ``bare_run``: ``containers.run(image, "sleep infinity", detach=True)`` through the Docker SDK
  (create, inspect, start), the same image as the sessions;
- ``bare_run_session_spec``: the same, with a session's own create options (tmpfs mounts,
  seccomp profile, limits, docker-init, the watchdog as main process): what the engine's part
  of a session costs, without the orchestrator;
- ``cold_session``: ``create_session()`` through the public Python API (container created and
  started, worker exec'd and ready, registry row written);
- ``parallel``: ten of each started at once (wall time until the last is ready);
- ``bare_rm``: ``remove_container(force=True)`` through the SDK (``docker rm -f``), against
  ``destroy`` of a session (answered once its container is gone).

Each create of a session is split into steps, timed from outside the product (bench-only
wrappers, nothing on the normal path): every engine round trip by kind (create, inspect,
start, exec create, exec attach), the worker's exec until its ready frame, the registry's
writes, the policy and image checks; the rest is the orchestrator's own work. ``shares`` are
each step's share of the p50 cold session. Every container carries ``sandhold.bench``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import docker
import requests
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator._core.manager import SessionManager
from orchestrator.backend.base import ContainerSpec
from orchestrator.backend.docker._attach import AttachedExec
from orchestrator.backend.docker._spec import create_kwargs
from orchestrator.registry.store import Registry
from orchestrator.session.repl.worker_process import WorkerProcess

BENCH = "cold_start"
LABELS = {"sandhold.bench": BENCH}
ORCHESTRATOR_ID = f"bench-cold-start-{os.getpid()}"

# Steps of one create, in seconds, collected while ``_recording`` is on (one create at a time).
_steps: collections.Counter[str] = collections.Counter()
_recording = False

_ENGINE_PATHS = (
    ("POST", re.compile(r"/containers/create$"), "engine.container_create"),
    ("GET", re.compile(r"/containers/[0-9a-f]+/json$"), "engine.container_inspect"),
    ("POST", re.compile(r"/containers/[0-9a-f]+/start$"), "engine.container_start"),
    ("POST", re.compile(r"/containers/[0-9a-f]+/exec$"), "engine.exec_create"),
    ("GET", re.compile(r"/exec/[0-9a-f]+/json$"), "engine.exec_inspect"),
    ("DELETE", re.compile(r"/containers/[0-9a-f]+$"), "engine.container_remove"),
)


@contextmanager
def _step(name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        if _recording:
            _steps[name] += time.perf_counter() - started


def _engine_kind(method: str, url: str) -> str:
    path = url.split("?", 1)[0]
    for want, pattern, name in _ENGINE_PATHS:
        if method == want and pattern.search(path):
            return name
    return f"engine.other {method}"


def _wrap_sync(owner: Any, name: str, step: Callable[..., str]) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _step(step(*args, **kwargs)):
            return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _wrap_async(owner: Any, name: str, step: str) -> None:
    original = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _step(step):
            return await original(*args, **kwargs)

    setattr(owner, name, wrapper)


def instrument() -> None:
    """Time each step of a create from outside: engine round trips, the exec attach, the
    worker's start until its ready frame, registry writes, policy and image checks."""
    _wrap_sync(
        requests.Session, "request", lambda _s, method, url, *a, **k: _engine_kind(method, url)
    )
    original_start = AttachedExec.start.__func__  # type: ignore[attr-defined]

    async def attach(cls: Any, *args: Any, **kwargs: Any) -> Any:
        with _step("engine.exec_attach"):
            return await original_start(cls, *args, **kwargs)

    AttachedExec.start = classmethod(attach)  # type: ignore[method-assign,assignment]
    original_worker = WorkerProcess.start.__func__  # type: ignore[attr-defined]

    async def worker(cls: Any, *args: Any, **kwargs: Any) -> Any:
        with _step("worker_start_total"):
            return await original_worker(cls, *args, **kwargs)

    WorkerProcess.start = classmethod(worker)  # type: ignore[method-assign,assignment]
    for name in ("add_session", "set_worker_pid", "remove_session"):
        _wrap_sync(Registry, name, lambda *a, _n=name, **k: f"registry.{_n}")
    _wrap_sync(SessionManager, "policy", lambda *a, **k: "checks.policy")
    _wrap_async(SessionManager, "_image_for", "checks.image")


async def bare_run(client: docker.DockerClient, image: str) -> tuple[float, str]:
    started = time.perf_counter()
    container = await anyio.to_thread.run_sync(
        lambda: client.containers.run(image, ["sleep", "infinity"], detach=True, labels=LABELS)
    )
    return time.perf_counter() - started, container.id


async def bare_run_spec(client: docker.DockerClient, kwargs: dict[str, Any]) -> tuple[float, str]:
    options = dict(kwargs)
    image, command = options.pop("image"), options.pop("command")
    started = time.perf_counter()
    container = await anyio.to_thread.run_sync(
        lambda: client.containers.run(image, command, **options)
    )
    return time.perf_counter() - started, container.id


async def bare_rm(client: docker.DockerClient, container_id: str) -> float:
    started = time.perf_counter()
    await anyio.to_thread.run_sync(lambda: client.api.remove_container(container_id, force=True))
    return time.perf_counter() - started


async def all_at_once(count: int, start: Callable[[], Awaitable[Any]]) -> tuple[float, list[Any]]:
    made: list[Any] = []

    async def one() -> None:
        made.append(await start())

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    return time.perf_counter() - started, made


def shares(samples: list[dict[str, float]], totals: list[float]) -> dict[str, Any]:
    """Each step's median over the samples, and its share of the median total."""
    p50 = statistics.median(totals)
    names = sorted({name for sample in samples for name in sample})
    steps = {name: statistics.median(s.get(name, 0.0) for s in samples) for name in names}
    # The worker's total holds its exec create and attach: shown apart, and the rest of it.
    inside = steps.get("engine.exec_create", 0.0) + steps.get("engine.exec_attach", 0.0)
    if "worker_start_total" in steps:
        steps["worker.ready_after_attach"] = max(steps.pop("worker_start_total") - inside, 0.0)
    steps["orchestrator.rest"] = max(p50 - sum(steps.values()), 0.0)
    return {
        name: {"p50_ms": round(value * 1000, 2), "share": round(value / p50, 3)}
        for name, value in sorted(steps.items(), key=lambda item: -item[1])
    }


async def main(rounds: int, parallel: int) -> None:
    global _recording
    instrument()
    client = docker.from_env(timeout=120)
    config = OrchestratorConfig(orchestrator_id=ORCHESTRATOR_ID, extra_labels=LABELS)
    bare_ids: list[str] = []
    try:
        async with Orchestrator(config) as orch:
            image = orch._image
            assert image is not None
            # Warm-up of both paths (image pages, the engine's caches).
            for _ in range(2):
                _, cid = await bare_run(client, image)
                await bare_rm(client, cid)
                await orch.destroy((await orch.create_session()).id)
            # Another orchestrator id on these, so that no reconcile takes them for its own.
            spec = ContainerSpec(
                image=image,
                policy=orch.policy(None),
                session_id="bench-bare",
                tenant="bench",
                orchestrator_id=f"{ORCHESTRATOR_ID}-bare",
                extra_labels=LABELS,
            )
            kwargs = create_kwargs(spec)
            bare, bare_spec, bare_remove, cold, destroy, steps = [], [], [], [], [], []
            for _ in range(rounds):  # interleaved, so load changes hit all alike
                took, cid = await bare_run(client, image)
                bare.append(took)
                bare_remove.append(await bare_rm(client, cid))
                took, cid = await bare_run_spec(client, kwargs)
                bare_spec.append(took)
                await bare_rm(client, cid)
                _steps.clear()
                _recording = True
                started = time.perf_counter()
                session = await orch.create_session()
                cold.append(time.perf_counter() - started)
                _recording = False
                steps.append(dict(_steps))
                started = time.perf_counter()
                await orch.destroy(session.id)
                destroy.append(time.perf_counter() - started)
            bare_wall, made = await all_at_once(parallel, lambda: bare_run(client, image))
            bare_ids.extend(cid for _, cid in made)
            for cid in list(bare_ids):
                await bare_rm(client, cid)
                bare_ids.remove(cid)
            sessions_wall, sessions = await all_at_once(parallel, orch.create_session)
            for session in sessions:
                await orch.destroy(session.id)
    finally:
        for cid in bare_ids:
            client.api.remove_container(cid, force=True)
        client.close()
    figures: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]},
        "bare_run": summary(bare),
        "bare_run_session_spec": summary(bare_spec),
        "cold_session": summary(cold),
        "cold_over_bare_p50": round(statistics.median(cold) / statistics.median(bare), 2),
        "cold_over_bare_session_spec_p50": round(
            statistics.median(cold) / statistics.median(bare_spec), 2
        ),
        "cold_steps": shares(steps, cold),
        "parallel": {
            "count": parallel,
            "bare_run_s": round(bare_wall, 3),
            "sessions_s": round(sessions_wall, 3),
            "sessions_over_bare": round(sessions_wall / bare_wall, 2),
        },
        "bare_rm": summary(bare_remove),
        "destroy": summary(destroy),
        "destroy_over_rm_p50": round(
            statistics.median(destroy) / statistics.median(bare_remove), 2
        ),
        "targets": {"cold_over_bare": 1.3, "parallel_over_bare": 1.05, "destroy_over_rm": 1.5},
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=10)
    arguments = parser.parse_args()
    anyio.run(main, arguments.rounds, arguments.parallel)
