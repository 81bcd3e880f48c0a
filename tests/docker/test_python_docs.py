"""Every Python example of docs/python.md runs as written, and prints what its comments say.

Each fenced ``python`` block is run on its own, as a script, with the environment a reader
would set: ``SANDHOLD_IMAGE`` and the test run's orchestrator id and labels (read by
``OrchestratorConfig.from_env()``, so every container is found and removed), and
``SANDHOLD_URL``/``SANDHOLD_API_KEY`` naming a REST server started for the test (the remote
example). A ``# value`` comment after a ``print(...)`` is the line that print must write."""

from __future__ import annotations

import contextlib
import io
import re
import secrets
from pathlib import Path

import pytest

from orchestrator import SyncOrchestrator
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.docker.test_http_api import KEY_A
from tests.docker.test_python_repl import config
from tests.docker.test_streaming import rest_server

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCK = re.compile(r"```python\n(.*?)\n```", re.S)
PRINTED = re.compile(r"^\s*print\(.*\)\s+# (.+)$")


def blocks() -> list[str]:
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def expected_lines(code: str) -> list[str]:
    return [m.group(1).strip() for line in code.splitlines() if (m := PRINTED.match(line))]


def test_the_page_has_its_examples() -> None:
    assert len(blocks()) >= 7
    assert all(expected_lines(code) or "assert" in code for code in blocks())


@pytest.mark.parametrize("index", range(len(blocks())))
def test_each_example_runs_and_prints_what_it_says(
    index: int, worker_image: ImageBuildResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = blocks()[index]
    monkeypatch.setenv("SANDHOLD_IMAGE", worker_image.tag)
    monkeypatch.setenv("SANDHOLD_ORCHESTRATOR_ID", f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}")
    monkeypatch.setenv("SANDHOLD_EXTRA_LABELS", f"{TEST_RUN_LABEL}={RUN_ID}")
    output = io.StringIO()
    with contextlib.ExitStack() as stack:
        if "SANDHOLD_URL" in code:
            server = stack.enter_context(SyncOrchestrator(config(worker_image.tag)))
            served = server.portal.wrap_async_context_manager(rest_server(server.orchestrator))
            monkeypatch.setenv("SANDHOLD_URL", stack.enter_context(served))
            monkeypatch.setenv("SANDHOLD_API_KEY", KEY_A)
        with contextlib.redirect_stdout(output):
            exec(compile(code, f"{PAGE.name}[{index}]", "exec"), {"__name__": "__main__"})
    printed = [line.strip() for line in output.getvalue().splitlines() if line.strip()]
    assert printed == expected_lines(code)
