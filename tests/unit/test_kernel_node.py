"""The JavaScript kernel's protocol, with the kernel started as a local subprocess driving the
host's node (no container; where node is not installed, skipped, or failed under CI): bindings
and functions kept between cells, the last value as the result, console output, an error with
its stack, top-level await, a cell's env, SIGINT with the state kept, and a cell that cannot
read the next one."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.unit.test_repl_worker_protocol import WorkerProcess, worker_config

KERNEL = Path(__file__).resolve().parents[2] / "orchestrator" / "worker" / "kernel_node.py"


@pytest.fixture(autouse=True)
def host_node() -> None:
    if shutil.which("node") is None:
        if IN_CI:
            pytest.fail("CI is set and node is not installed: the kernel's tests must run")
        pytest.skip("node is not installed")


class Kernel(WorkerProcess):
    def __init__(self, config: dict[str, Any]) -> None:
        env = {key: value for key, value in os.environ.items() if key != "SANDHOLD_WORKER_CONFIG"}
        env["SANDHOLD_WORKER_CONFIG"] = json.dumps(config)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(KERNEL)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self._count = 0
        threading.Thread(target=self._read, daemon=True).start()


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    started = Kernel(worker_config("unrestricted"))
    ready = started.next_message()
    assert ready["type"] == "ready" and ready["python"].startswith("node v")
    yield started
    started.close()


def test_bindings_are_kept_and_the_last_value_is_the_result(kernel: Kernel) -> None:
    first = kernel.execute(
        "let x = 41\nfunction twice(n) { return n * 2 }\nconsole.log('hi')\nx + 1"
    )
    assert first["success"] and first["stdout"] == "hi\n" and first["result_repr"] == "42"
    assert first["results"] == [{"text/plain": "42", "is_main_result": True}]
    assert kernel.execute("twice(x)")["result_repr"] == "82"
    assert kernel.execute("const s = 'a'; s + s")["result_repr"] == "'aa'"
    assert kernel.execute("x = 1")["result_repr"] == "1"
    quiet = kernel.execute("let y = 2")
    assert quiet["success"] and quiet["result_repr"] is None and quiet["results"] == []


def test_an_error_comes_with_its_name_and_stack(kernel: Kernel) -> None:
    failed = kernel.execute("function f() { throw new TypeError('bad') }\nf()")
    assert not failed["success"] and failed["error_type"] == "TypeError"
    assert failed["error_message"] == "bad" and "at f" in failed["traceback"]
    assert kernel.execute("missing")["error_type"] == "ReferenceError"
    assert kernel.execute("console.error('e')")["stderr"] == "e\n"


def test_top_level_await_keeps_its_bindings_and_value(kernel: Kernel) -> None:
    ran = kernel.execute("const v = await Promise.resolve(5)\nv * 2")
    assert ran["success"] and ran["result_repr"] == "10", ran
    assert kernel.execute("v")["result_repr"] == "5"
    assert kernel.execute("await new Promise(r => setTimeout(r, 5)); 'later'")["result_repr"] == (
        "'later'"
    )


def test_a_cells_env_is_its_own(kernel: Kernel) -> None:
    assert (
        kernel.call("execute", code="process.env.ONLY", env={"ONLY": "x"})["result_repr"] == "'x'"
    )
    assert kernel.execute("process.env.ONLY")["result_repr"] is None


def test_sigint_ends_a_waiting_cell_and_keeps_the_state(kernel: Kernel) -> None:
    kernel.execute("globalThis.kept = 'yes'")
    request_id = kernel.send(
        "execute", code="console.log('started'); await new Promise(r => setTimeout(r, 30000))",
        stream=True,
    )  # fmt: skip
    assert kernel.next_message()["text"] == "started\n"
    os.kill(kernel.proc.pid, signal.SIGINT)
    reply = kernel.next_message()
    assert reply["id"] == request_id and reply["interrupted"] and not reply["success"]
    assert kernel.execute("kept")["result_repr"] == "'yes'"


def test_a_cell_reads_no_request_after_it(kernel: Kernel) -> None:
    read = kernel.execute("require('fs').readFileSync(0, 'utf8').length")
    assert read["result_repr"] == "0"
    assert kernel.execute("1 + 1")["result_repr"] == "2"


def test_import_lines_run_as_requires_and_a_string_is_shown_as_its_text(kernel: Kernel) -> None:
    imported = kernel.execute(
        "  import { readFileSync as read } from 'fs'\n  import * as path from 'path'\n"
        "  import os from 'os'\n  typeof read + path.sep + typeof os.cpus"
    )
    assert imported["success"] and imported["result_repr"] == "'function/function'", imported
    assert imported["results"] == [{"text/plain": "function/function", "is_main_result": True}]
    assert kernel.execute("typeof read")["result_repr"] == "'function'"
    assert kernel.execute("await Promise.resolve('done')")["results"][0]["text/plain"] == "done"
    indented = kernel.execute("\n    const base = 40\n    await Promise.resolve(base + 2)\n    ")
    assert indented["result_repr"] == "42", indented
