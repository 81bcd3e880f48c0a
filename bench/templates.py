"""Templates: image sizes, cold sessions and the first ``import pandas``, each against its
baseline in the same run; prints JSON.

    .venv/bin/python bench/templates.py [--rounds 5]

- ``image_mb``: the engine's size of the base (worker) image and of python-data;
- ``cold_session``: create and destroy a session of ``default`` (base) and of ``python-data``
  (the python-data image is built first, outside the timing, if missing);
- ``first_import_pandas``: the first ``import pandas`` of a session: cold python-data against one
  taken from a warm pool, where the template's preload imported it before it was handed out.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import anyio
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig

LABELS = {"sandhold.bench": "templates"}
POLICY = "python-data"
# A pool refill builds a container and imports numpy, pandas, matplotlib and scipy.
REFILL_TIMEOUT = 120.0


async def cold_session(orch: Orchestrator, policy: str, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        session = await orch.create_session(policy=policy)
        samples.append(time.perf_counter() - started)
        await orch.destroy(session.id)
    return samples


async def first_import(orch: Orchestrator, rounds: int, *, pooled: bool) -> list[float]:
    """In-worker time of the first ``import pandas`` (the cell's execution_time_ms)."""
    samples = []
    for _ in range(rounds):
        if pooled:
            with anyio.fail_after(REFILL_TIMEOUT):
                while orch.pool_status()[POLICY]["ready"] < 1:  # noqa: ASYNC110 (no pool event)
                    await anyio.sleep(0.05)
            session = await orch.create_session(policy=POLICY)
        else:
            session = await orch.create_session(policy=POLICY)
        result = await orch.execute("import pandas", session_id=session.id)
        assert result.success, result
        samples.append(result.execution_time_ms / 1000)
        await orch.destroy(session.id)
    return samples


async def image_mb(orch: Orchestrator, policy: str) -> float:
    session = await orch.create_session(policy=policy)
    try:
        image = (await orch.backend.inspect(session.container_id))["Image"]
        size = await orch.backend.client.call(lambda sdk: sdk.api.inspect_image(image)["Size"])
    finally:
        await orch.destroy(session.id)
    return round(size / 1e6, 1)


async def main(rounds: int) -> None:
    config = OrchestratorConfig(orchestrator_id="bench-templates", extra_labels=LABELS)
    async with Orchestrator(config) as orch:
        built = time.perf_counter()
        sizes = {"base": await image_mb(orch, "default"), POLICY: await image_mb(orch, POLICY)}
        first_use_s = round(time.perf_counter() - built, 1)
        cold = {
            "base": summary(await cold_session(orch, "default", rounds)),
            POLICY: summary(await cold_session(orch, POLICY, rounds)),
        }
        imports = {"cold": summary(await first_import(orch, rounds, pooled=False))}
        await orch.set_pool_size(POLICY, 1)
        imports["pooled_with_preload"] = summary(await first_import(orch, rounds, pooled=True))
        await orch.set_pool_size(POLICY, 0)
    figures = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "image_mb": sizes,
        "first_use_s_incl_any_build": first_use_s,
        "cold_session": cold,
        "first_import_pandas": imports,
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    anyio.run(main, parser.parse_args().rounds)
