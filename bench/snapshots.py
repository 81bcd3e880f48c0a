"""Snapshots: what taking one, starting a session from one, and forking cost, with a session
holding a few files and ``--mib`` MiB of data in /workspace; prints JSON.

    .venv/bin/python bench/snapshots.py [--rounds 3] [--mib 8]

- ``snapshot``: ``session snapshot`` (the tmpfs roots archived, the container committed twice);
- ``create_from_snapshot``: ``session create`` with it (a container from its image, the files
  unpacked), ``destroy`` not counted;
- ``fork``: ``session fork`` (both of the above, and the snapshot deleted);
- ``load_average``: the machine's 1-minute load when the run ended (the engine's commits are
  disk-bound: a loaded machine's figures are several times an idle one's).
Every snapshot and session it makes is removed before it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import anyio
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig

LABELS = {"sandhold.bench": "snapshots"}
POLICY = "unrestricted-python"


async def session(orch: Orchestrator, **args: Any) -> dict[str, Any]:
    answer = (await orch.call("session", args)).structured
    if not answer["success"]:
        raise RuntimeError(answer)
    return answer


async def main(rounds: int, mib: int) -> None:
    config = OrchestratorConfig(extra_labels=LABELS)
    taking, creating, forking = [], [], []
    async with Orchestrator(config) as orch:
        sid = (await session(orch, operation="create", policy=POLICY))["session_id"]
        await orch.execute(
            "import os\nos.makedirs('/workspace/src', exist_ok=True)\n"
            "for i in range(50): open(f'/workspace/src/m{i}.py', 'w').write('x = 1\\n' * 100)\n"
            f"open('/workspace/data.bin', 'wb').write(os.urandom({mib} * 1024 * 1024))",
            session_id=sid,
        )
        for _ in range(rounds):
            started = time.perf_counter()
            taken = await session(orch, operation="snapshot", session_id=sid)
            taking.append(time.perf_counter() - started)
            started = time.perf_counter()
            made = await session(orch, operation="create", snapshot=taken["snapshot_id"])
            creating.append(time.perf_counter() - started)
            await orch.destroy(made["session_id"])
            await session(orch, operation="delete_snapshot", snapshot=taken["snapshot_id"])
            started = time.perf_counter()
            forked = await session(orch, operation="fork", session_id=sid)
            forking.append(time.perf_counter() - started)
            await orch.destroy(forked["session_id"])
        size = taken["size_bytes"]
    print(
        json.dumps(
            {
                "snapshot": summary(taking),
                "create_from_snapshot": summary(creating),
                "fork": summary(forking),
                "snapshot_size_bytes": size,
                "load_average": os.getloadavg()[0],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=8)
    options = parser.parse_args()
    anyio.run(main, options.rounds, options.mib)
