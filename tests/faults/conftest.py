"""Fixtures of the fault tests (marker ``faults``): a private Docker engine for the whole run
(``private_engine``), and per test the environment that points sandhold at it (``engine``).

The machine's dockerd is never stopped, restarted or signalled: every fault is played on the
private one. Without root or the daemons' binaries these tests fail under CI and skip elsewhere,
as every engine-backed test does.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from orchestrator.images import ImageBuildResult
from tests.conftest import IN_CI, RUN_ID, TEST_RUN_LABEL
from tests.faults.private_engine import EGRESS_SUBNETS, UPSTREAM_NETWORK, PrivateEngine

CASE_LABEL = "sandhold.test-case"


def _cannot_run() -> str | None:
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    missing = [b for b in ("dockerd", "containerd", "runc", "docker") if shutil.which(b) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


@pytest.fixture(scope="session")
def private_engine(worker_image: ImageBuildResult) -> Iterator[PrivateEngine]:
    """A dockerd of this run's own with the worker image loaded; gone, with its directories,
    when the run ends."""
    problem = _cannot_run()
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI is set and {problem}: the fault tests must run", pytrace=False)
        pytest.skip(problem)
    with PrivateEngine() as engine:
        engine.load_image(worker_image.tag)
        yield engine


@dataclass(frozen=True)
class FaultCase:
    """One test's view of the private engine: sandhold reaches it through the environment, and
    everything the test's orchestrators make carries ``label``."""

    engine: PrivateEngine
    image: str
    case: str

    @property
    def label(self) -> str:
        return f"{CASE_LABEL}={self.case}"

    @property
    def extra_labels(self) -> dict[str, str]:
        return {TEST_RUN_LABEL: RUN_ID, CASE_LABEL: self.case}

    def leftovers(self) -> dict[str, list[str]]:
        return self.engine.leftovers(self.label)


@pytest.fixture
def engine(
    private_engine: PrivateEngine, worker_image: ImageBuildResult, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FaultCase]:
    """``DOCKER_HOST`` (and the egress settings) of this test name the private engine, which
    answers; what the test made is removed after it."""
    private_engine.ensure_up()
    monkeypatch.setenv("DOCKER_HOST", private_engine.docker_host)
    monkeypatch.setenv("SANDHOLD_EGRESS_NETWORK", UPSTREAM_NETWORK)
    monkeypatch.setenv("SANDHOLD_EGRESS_SUBNETS", EGRESS_SUBNETS)
    case = FaultCase(private_engine, worker_image.tag, secrets.token_hex(6))
    try:
        yield case
    finally:
        private_engine.ensure_up()
        _remove_case(private_engine, case.label)


def _remove_case(engine: PrivateEngine, label: str) -> None:
    client = engine.client()
    try:
        for container in client.api.containers(all=True, filters={"label": label}):
            client.api.remove_container(container["Id"], force=True)
        for network in client.api.networks(filters={"label": label}):
            client.api.remove_network(network["Id"])
    finally:
        client.close()
