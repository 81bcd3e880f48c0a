"""The soak of ``bench/soak.py`` for two minutes against the private engine: mixed load through
REST, MCP and the E2B port from several tenants, with faults injected at random (the engine
restarted or frozen, ``kill -9`` of serve, a REPL worker killed). Nothing may be left over,
every session lost must fall in a restart's window and say ``session_lost``, every state reset
must be reported, no call may answer ``internal``, serve's memory may not grow past 10 %."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.soak import run_soak
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_RUN_LABEL
from tests.faults.private_engine import PrivateEngine

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

MINUTES = 2.0


# Two minutes of load, serve's start and stops, and an engine restart's worst case (40 s).
@pytest.mark.timeout(600)
async def test_a_two_minute_soak_with_faults_leaks_nothing_and_reports_every_loss(
    private_engine: PrivateEngine, worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    private_engine.ensure_up()
    try:
        report = await run_soak(
            private_engine,
            worker_image.tag,
            tmp_path,
            minutes=MINUTES,
            extra_labels=f"{TEST_RUN_LABEL}={RUN_ID}",
        )
    finally:
        private_engine.ensure_up()
    shown = json.dumps(report, indent=1)
    assert report["passed"], shown
    assert report["leftovers"] == {"containers": 0, "networks": 0, "registry_rows": 0}, shown
    assert report["faults"], shown  # the first comes after 20 s of warm-up
    interfaces = {call.split(".")[0] for call in report["calls"] if call.endswith(".ok")}
    assert interfaces == {"rest", "mcp", "e2b"}, shown
