"""The bash kernel's protocol, with the kernel started as a local subprocess (no container):
state kept between cells, output split at the markers whatever the reads, a status as the
cell's error, streamed frames, SIGINT with the state kept, a cell that cannot read the
commands after it, and the operations a kernel does not have. Every wait is bounded."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_repl_worker_protocol import WorkerProcess, worker_config

KERNEL = Path(__file__).resolve().parents[2] / "orchestrator" / "worker" / "kernel_bash.py"


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
    started = Kernel(worker_config("unrestricted", max_stream_bytes=1 << 16))
    ready = started.next_message()
    assert ready["type"] == "ready" and ready["pid"] == started.proc.pid
    assert ready["python"].startswith("bash ")
    yield started
    started.close()


def test_state_and_cwd_are_kept_and_streams_kept_apart(kernel: Kernel) -> None:
    first = kernel.execute("N=4; cd /tmp; echo out; echo err >&2")
    assert first["success"] and first["stdout"] == "out\n" and first["stderr"] == "err\n"
    second = kernel.execute("echo $((N * 2)) $(pwd)")
    assert second["stdout"] == "8 /tmp\n"


def test_output_without_a_newline_and_larger_than_a_read_comes_whole(kernel: Kernel) -> None:
    assert kernel.execute("printf abc")["stdout"] == "abc"
    big = kernel.execute("head -c 200000 /dev/zero | tr '\\0' x")
    assert big["stdout"] == "x" * (1 << 16) and big["stdout_bytes"] == 200000
    assert big["truncated"]
    assert kernel.execute("echo after")["stdout"] == "after\n"


def test_a_status_is_the_cells_error(kernel: Kernel) -> None:
    failed = kernel.execute("ls /no/such/dir")
    assert not failed["success"] and failed["error_type"] == "ExitCode"
    assert failed["error_message"] == "exit status 2" and "No such file" in failed["stderr"]


def test_a_cell_reads_no_command_after_it(kernel: Kernel) -> None:
    read = kernel.execute("read line; echo [$line]")
    assert read["stdout"] == "[]\n"
    assert kernel.execute("echo still")["stdout"] == "still\n"


def test_a_streaming_cell_sends_frames_before_its_reply(kernel: Kernel) -> None:
    request_id = kernel.send("execute", code="echo one; echo two >&2", stream=True)
    frames = []
    while (message := kernel.next_message())["type"] == "stream":
        frames.append((message["name"], message["text"]))
    assert message["id"] == request_id and message["success"]
    assert sorted(frames) == [("stderr", "two\n"), ("stdout", "one\n")]


def test_sigint_ends_the_cell_and_keeps_the_state(kernel: Kernel) -> None:
    kernel.execute("KEEP=yes")
    request_id = kernel.send("execute", code="echo started; sleep 30; echo never", stream=True)
    assert kernel.next_message()["text"] == "started\n"
    os.kill(kernel.proc.pid, signal.SIGINT)
    reply = kernel.next_message()
    assert reply["id"] == request_id and reply["interrupted"] and not reply["success"]
    assert reply["stdout"] == "started\n"
    assert kernel.execute("echo $KEEP")["stdout"] == "yes\n"


def test_a_cells_env_is_its_own_and_a_bad_name_is_refused(kernel: Kernel) -> None:
    reply = kernel.call("execute", code="echo $ONLY", env={"ONLY": "here"})
    assert reply["stdout"] == "here\n"
    assert kernel.execute("echo [$ONLY]")["stdout"] == "[]\n"
    refused = kernel.call("execute", code="true", env={"A-B": "x"})
    assert refused["error_type"] == "validation"


def test_python_only_operations_are_not_supported(kernel: Kernel) -> None:
    refused = kernel.call("list_variables")
    assert not refused["ok"] and refused["error_type"] == "not_supported"
    assert kernel.call("ping")["pong"] is True


def test_exit_ends_the_kernel_after_its_reply(kernel: Kernel) -> None:
    reply = kernel.execute("echo bye; exit 3")
    assert reply["stdout"] == "bye\n" and reply["error_type"] == "ExitCode"
    assert kernel.proc.wait(10) == 0
