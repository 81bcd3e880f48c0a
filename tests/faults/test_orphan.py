"""No orchestrator ever comes back: each session container ends itself after its policy's
``orphan_grace_s``. What stays on the engine is exactly what docs/operations.md says: the
stopped session containers (their writable layer and logs) and, for a session with a network,
its egress proxy and network; the next start of an orchestrator of the same id (its registry)
removes all of it and tells the owner the session was lost."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from orchestrator.backend.docker._egress import LABEL_EGRESS_SESSION as LABEL_EGRESS
from tests.faults.conftest import FaultCase
from tests.faults.harness import EGRESS_POLICY, faulted, write_policies

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.anyio]

GRACE_S = 3
# The watchdog looks at the lease every second or so; the stop itself takes a moment.
END_TIMEOUT = GRACE_S + 30.0


def _short_grace(directory: Path) -> None:
    for name, extends in (("faults-orphan", "default"), ("faults-orphan-net", EGRESS_POLICY)):
        (directory / f"{name}.toml").write_text(
            f'extends = "{extends}"\nname = "{name}"\n[timeouts]\norphan_grace_s = {GRACE_S}\n'
        )


async def test_an_orphan_ends_itself_and_the_next_start_removes_what_it_left(
    engine: FaultCase, tmp_path: Path
) -> None:
    _short_grace(write_policies(tmp_path / "policies"))
    async with faulted(engine, tmp_path, on_shutdown="persist") as f:
        plain = await f.rest("python_repl", operation="execute", code="1", policy="faults-orphan")
        net = await f.rest("python_repl", operation="execute", code="1", policy="faults-orphan-net")
        assert plain["success"] and net["success"], (plain, net)
    # Its orchestrator is gone for good (it left the sessions, as a killed one would).

    with anyio.fail_after(END_TIMEOUT):
        while any(" running " in c for c in _sessions(engine)):  # noqa: ASYNC110 (polling the engine)
            await anyio.sleep(0.5)
    left = engine.leftovers()
    sessions = _sessions(engine)
    assert len(sessions) == 2 and all(" exited " in c for c in sessions), left
    assert len(left["containers"]) == 3, left  # and the network session's egress proxy
    assert left["networks"], left  # the network session's egress networks
    assert all(n.startswith("sandhold-egress-") for n in left["networks"]), left

    async with faulted(engine, tmp_path) as f:
        assert engine.leftovers() == {"containers": [], "networks": []}
        for sid in (plain["session_id"], net["session_id"]):
            gone = await f.rest("python_repl", operation="execute", code="1", session_id=sid)
            assert gone["error_type"] == "session_lost", gone


def _sessions(engine: FaultCase) -> list[str]:
    """The session containers (not the egress proxies), as ``id state``."""
    client = engine.engine.client()
    try:
        found = client.api.containers(all=True, filters={"label": engine.label})
    finally:
        client.close()
    return [f"{c['Id'][:12]} {c['State']} " for c in found if LABEL_EGRESS not in c["Labels"]]
