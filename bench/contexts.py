"""REPL contexts: a cell's round trip per language on a live context, what a new context costs,
and the memory an idle context holds; prints JSON.

    .venv/bin/python bench/contexts.py [--rounds 300]

- ``execute_p50`` per language: ``execute`` of a trivial cell (``1+1``; ``true`` in bash) in a
  context made beforehand, through the public Python API; Python's default context beside it;
- ``create_context``: ``create_context`` then ``remove_context`` (a worker started and ended);
- ``idle_context_mib``: the resident memory of an idle context's processes (its worker, and for
  bash the shell, for JavaScript node), read from /proc in the container.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Awaitable, Callable

import anyio
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig

LABELS = {"sandhold.bench": "contexts"}
# The code-interpreter template has node (built on first use); python and bash run anywhere.
POLICY = "code-interpreter"
CELLS = {"python": "1+1", "bash": "true", "javascript": "1+1"}
# Sums VmRSS of the worker whose pid is P and of its children (a kernel's shell).
RSS = (
    "import os,sys\n"
    "def rss(p):\n"
    "    for l in open(f'/proc/{p}/status'):\n"
    "        if l.startswith('VmRSS:'): return int(l.split()[1])\n"
    "    return 0\n"
    "kids=[int(c) for t in os.listdir(f'/proc/{P}/task') "
    "for c in open(f'/proc/{P}/task/{t}/children').read().split()]\n"
    "round((rss(P)+sum(rss(k) for k in kids))/1024, 1)"
)


async def timed(rounds: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


async def bench_language(
    orch: Orchestrator, sid: str, context: str | None, rounds: int
) -> list[float]:
    language = "python" if context is None else orch.list_contexts(sid)[-1].language
    cell = CELLS[language]

    async def step() -> None:
        if context is None:
            result = await orch.execute(cell, session_id=sid)
        else:
            result = await orch.execute_in_context(cell, session_id=sid, context=context)
        assert result.success, result

    await timed(30, step)
    return await timed(rounds, step)


async def idle_mib(orch: Orchestrator, sid: str, context: str) -> float:
    pid_cell = {
        "python": "import os\nos.getpid()",
        "bash": "echo $PPID",
        "javascript": "process.ppid",
    }
    info = next(c for c in orch.list_contexts(sid) if c.id == context)
    found = await orch.execute_in_context(pid_cell[info.language], session_id=sid, context=context)
    pid = (found.result_repr or found.stdout).strip()
    measured = await orch.execute(f"P = {pid}\n" + RSS, session_id=sid)
    return float(measured.result_repr or "nan")


async def main(rounds: int) -> None:
    config = OrchestratorConfig(orchestrator_id="bench-contexts", extra_labels=LABELS)
    figures: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    async with Orchestrator(config) as orch:
        made = await orch.execute("0", policy=POLICY)
        sid = made.session_id
        latency = {"python_default": summary(await bench_language(orch, sid, None, rounds))}
        memory = {}
        for language in CELLS:
            context = (await orch.create_context(sid, language=language)).id
            latency[language] = summary(await bench_language(orch, sid, context, rounds))
            memory[language] = await idle_mib(orch, sid, context)

        async def make_and_remove() -> None:
            made = await orch.create_context(sid, language="bash")
            await orch.remove_context(sid, made.id)

        figures["execute_p50"] = latency
        figures["create_context"] = summary(await timed(10, make_and_remove))
        figures["idle_context_mib"] = memory
        await orch.destroy(sid)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    anyio.run(main, parser.parse_args().rounds)
