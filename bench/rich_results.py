"""Rich results and streaming, each beside its baseline in the same run; prints JSON.

    .venv/bin/python bench/rich_results.py [--rounds 30]

In one python-data session (the template is built on first use):
- ``chart_png``: a cell that draws one line chart and returns it as a PNG, p50, and the PNG's
  size; its baseline ``same_cell_without_figure`` runs the same computation and closes the
  figure before the cell ends, so the difference is what rendering and shipping the PNG cost;
- ``execute_1p1``: ``1+1`` in the same session, the floor of any call;
- ``first_chunk_s``: a cell that prints once a second for three seconds, with ``on_stdout``:
  time from the call to its first streamed piece, against ``cell_end_s``, when the call ends.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import struct
import time
from collections.abc import Awaitable, Callable

import anyio
from _stats import summary

from orchestrator._api import Orchestrator, OrchestratorConfig

LABELS = {"sandhold.bench": "rich-results"}
SETUP = "import matplotlib.pyplot as plt\nxs = list(range(100))\nys = [x * x for x in xs]"
CHART = "fig, ax = plt.subplots(figsize=(6.4, 4.8))\nax.plot(xs, ys)\nax.set_title('squares')"
NO_FIGURE = CHART + "\nplt.close(fig)"
TICKS = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(1)"


async def timed(rounds: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples


async def main(rounds: int) -> None:
    config = OrchestratorConfig(orchestrator_id="bench-rich-results", extra_labels=LABELS)
    async with Orchestrator(config) as orch:
        first = await orch.execute(SETUP, policy="python-data")
        assert first.success, first
        sid = first.session_id
        sizes: list[int] = []

        async def chart() -> None:
            result = await orch.execute(CHART, session_id=sid)
            (bundle,) = [b for b in result.results if "image/png" in b]
            png = base64.b64decode(bundle["image/png"])
            assert struct.unpack(">II", png[16:24]) == (640, 480)
            sizes.append(len(png))

        async def no_figure() -> None:
            result = await orch.execute(NO_FIGURE, session_id=sid)
            assert result.success, result
            assert not result.results, result

        async def one_plus_one() -> None:
            assert (await orch.execute("1+1", session_id=sid)).result_repr == "2"

        await timed(3, chart)  # warm: fonts cached, the Agg canvas loaded
        charts = await timed(rounds, chart)
        plain = await timed(rounds, no_figure)
        floor = await timed(rounds, one_plus_one)

        pieces: list[float] = []
        started = time.perf_counter()
        await orch.call(
            "python_repl",
            {"operation": "execute", "session_id": sid, "code": TICKS},
            on_stdout=lambda text: pieces.append(time.perf_counter() - started),
        )
        ended = time.perf_counter() - started
        await orch.destroy(sid)
    chart_summary, plain_summary = summary(charts), summary(plain)
    figures = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "chart_png": chart_summary,
        "same_cell_without_figure": plain_summary,
        "png_render_and_ship_ms": round(chart_summary["p50_ms"] - plain_summary["p50_ms"], 3),
        "png_bytes": sorted(sizes)[len(sizes) // 2],
        "execute_1p1": summary(floor),
        "first_chunk_s": round(pieces[0], 3) if pieces else None,
        "streamed_pieces": len(pieces),
        "cell_end_s": round(ended, 3),
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    anyio.run(main, parser.parse_args().rounds)
