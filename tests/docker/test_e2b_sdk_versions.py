"""The older E2B SDK still in wide use, unmodified, in a virtualenv of its own (``e2b_venv``):
``e2b`` 2.45, the last minor before 2.51 moved creation to ``POST /v2/sandboxes``, so it makes
sandboxes with ``POST /sandboxes``, and ``e2b-code-interpreter`` 2.10.0, the newest that
accepts it (2.10.1 wants ``e2b>=2.52``). Against one real ``sandhold serve --e2b-port``, each
scenario of ``e2b_sdk_driver.py``: sandboxes made with metadata and envs, listed, commands
with exit codes and envs, files written, read and listed, paused and resumed, killed; a short
timeout that ends its sandbox; ``run_code`` under ``code-interpreter-v1``.

The newest SDK (the test extra's pins) runs in sandhold's own environment:
``test_e2b_sdk.py`` and ``test_e2b_code_interpreter.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.images import ImageBuildResult
from tests.docker.e2b_server import E2bServer, e2b_server
from tests.docker.e2b_venv import drive, sdk_python

# The code-interpreter template may be built on first use (some minutes on a cold cache).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

PINS = ("e2b==2.45.1", "e2b-code-interpreter==2.10.0")


@pytest.fixture(scope="module")
def old_sdk() -> Path:
    return sdk_python(PINS)


@pytest.fixture(scope="module")
def server(
    worker_image: ImageBuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2bServer]:
    with e2b_server(worker_image.tag, tmp_path_factory.mktemp("e2b-old"), set_env=False) as up:
        yield up


def test_sandboxes_commands_files_and_pause_work_through_the_v1_sdk(
    old_sdk: Path, server: E2bServer, tmp_path: Path
) -> None:
    seen = drive(old_sdk, "lifecycle", server.env(), tmp_path / "driver.stderr")
    assert seen["sdk"] == "2.45.1"
    assert seen["info"] == {
        "id_matches": True,
        "template": "base",
        "metadata": seen["info"]["metadata"] | {"n": "1"},
        "lifetime": seen["info"]["lifetime"],
        "state": "running",
    }
    assert 110 <= seen["info"]["lifetime"] <= 120
    assert seen["listed_n1"] == [True] and seen["listed_run"] is True
    assert seen["commands"] == {
        "exit_code": 0,
        "stdout": "out\nhello yes\n",
        "stderr": "err\n",
        "failed": {"raised": True, "exit_code": 3, "stderr": "why\n"},
    }
    assert seen["files"] == {
        "written_path": "/home/user/notes/a.txt",
        "text": "text one",
        "bytes": list(b"\x00\xffbytes"),
        "listed": [["b.bin", "file"], ["notes", "dir"]],
        "exists": [True, False],
    }
    assert seen["paused"] == {
        "first": True,
        "again": False,
        "state": "paused",
        "running_after_connect": True,
        "kept": "kept\n",
    }
    assert seen["killed"] is True and seen["killed_again"] is False
    assert seen["found_after_kill"] is False and seen["listed_after_kill"] == 0


def test_a_sandbox_is_gone_once_its_timeout_runs_out_through_the_v1_sdk(
    old_sdk: Path, server: E2bServer, tmp_path: Path
) -> None:
    seen = drive(old_sdk, "expiry", server.env(), tmp_path / "driver.stderr")
    assert seen == {"running_at_first": True, "running_at_end": False, "found": False}


def test_run_code_works_through_the_code_interpreter_sdk_of_the_v1_sdk(
    old_sdk: Path, server: E2bServer, tmp_path: Path
) -> None:
    seen = drive(old_sdk, "run_code", server.env(), tmp_path / "driver.stderr")
    assert seen == {"sdk": "2.10.0", "text": "42", "stdout": ["hi\n"], "error": "ZeroDivisionError"}
