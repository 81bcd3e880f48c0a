"""The REPL worker's protocol, with the worker started as a local subprocess (no container): the
ready line, the operations, fd-level capture, output floods, bad requests, SIGINT, metrics.
Every wait is bounded; replies are awaited on a queue fed by a reader thread."""

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

from orchestrator.policy.model import load_policy

WORKER = Path(__file__).resolve().parents[2] / "orchestrator" / "worker" / "repl_worker.py"
# Generous bounds: a slow CI machine still answers within them, a hang still fails the test.
REPLY_TIMEOUT = 20.0
EXIT_TIMEOUT = 10.0
# How long to wait for a reply after each SIGINT before sending another: the first may arrive
# before the cell has started, when the worker ignores it by design.
INTERRUPT_RETRY_TIMEOUT = 0.2


def worker_config(mode: str = "restricted", **overrides: object) -> dict[str, Any]:
    policy = load_policy("default")
    config: dict[str, Any] = {
        "mode": mode,
        "allowed_modules": list(policy.python.allowed_modules),
        "forbidden_modules": list(policy.python.forbidden_modules),
        "forbidden_builtins": list(policy.python.forbidden_builtins),
        "max_code_bytes": policy.python.max_code_bytes,
        "max_stream_bytes": policy.output.max_stream_bytes,
        "max_reply_bytes": policy.output.max_reply_bytes,
        "max_repr_chars": 2000,
        "max_result_bytes": policy.output.max_result_bytes,
        "persist": False,
    }
    config.update(overrides)
    return config


class WorkerProcess:
    """A worker subprocess with its protocol on our pipes."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        env = {key: value for key, value in os.environ.items() if key != "SANDHOLD_WORKER_CONFIG"}
        if config is not None:
            env["SANDHOLD_WORKER_CONFIG"] = json.dumps(config)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self._count = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")  # EOF

    def next_message(self, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout)
        assert line, "worker closed its output"
        assert line.endswith(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def send_line(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def send(self, op: str, **args: Any) -> str:
        self._count += 1
        request_id = f"r{self._count}"
        self.send_line(json.dumps({"id": request_id, "op": op, **args}).encode() + b"\n")
        return request_id

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        request_id = self.send(op, **args)
        reply = self.next_message()
        assert reply["type"] == "reply" and reply["id"] == request_id, reply
        return reply

    def execute(self, code: str) -> dict[str, Any]:
        reply = self.call("execute", code=code)
        assert reply["ok"], reply
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(EXIT_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def start(config: dict[str, Any]) -> WorkerProcess:
    worker = WorkerProcess(config)
    ready = worker.next_message()
    assert ready["type"] == "ready", ready
    return worker


@pytest.fixture
def restricted() -> Iterator[WorkerProcess]:
    worker = start(worker_config())
    yield worker
    worker.close()


@pytest.fixture
def unrestricted() -> Iterator[WorkerProcess]:
    worker = start(worker_config("unrestricted"))
    yield worker
    worker.close()


def interrupt_until_replied(worker: WorkerProcess, request_id: str) -> dict[str, Any]:
    for _ in range(int(REPLY_TIMEOUT / INTERRUPT_RETRY_TIMEOUT)):
        worker.proc.send_signal(signal.SIGINT)
        try:
            reply = worker.next_message(timeout=INTERRUPT_RETRY_TIMEOUT)
        except queue.Empty:
            continue
        assert reply["id"] == request_id
        return reply
    raise AssertionError("the worker never answered the interrupted request")


# --- start, stop ----------------------------------------------------------------------------


def test_the_worker_announces_itself_with_its_pid_and_versions() -> None:
    worker = WorkerProcess(worker_config())
    try:
        ready = worker.next_message()
        assert ready["pid"] == worker.proc.pid
        assert ready["protocol"] == 1
        assert ready["python"] == ".".join(map(str, sys.version_info[:3]))
    finally:
        worker.close()


@pytest.mark.parametrize(
    "config",
    [None, {"mode": "restricted"}, worker_config(mode="sandboxed"), worker_config(extra=1)],
    ids=["missing", "incomplete", "bad mode", "unknown key"],
)
def test_a_missing_or_invalid_config_is_fatal(config: dict[str, Any] | None) -> None:
    worker = WorkerProcess(config)
    try:
        message = worker.next_message()
        assert message["type"] == "fatal" and message["error_message"]
        assert worker.proc.wait(EXIT_TIMEOUT) == 2
    finally:
        worker.close()


def test_shutdown_replies_then_exits_cleanly(restricted: WorkerProcess) -> None:
    reply = restricted.call("shutdown")
    assert reply["ok"]
    assert restricted.proc.wait(EXIT_TIMEOUT) == 0


def test_end_of_input_ends_the_worker_cleanly(restricted: WorkerProcess) -> None:
    assert restricted.proc.stdin is not None
    restricted.proc.stdin.close()
    assert restricted.proc.wait(EXIT_TIMEOUT) == 0


# --- execute --------------------------------------------------------------------------------


def test_execute_reports_output_result_and_metrics(restricted: WorkerProcess) -> None:
    reply = restricted.execute("x = 42\nprint(x)\nx * 2")
    assert reply["success"] and reply["stdout"] == "42\n" and reply["stderr"] == ""
    assert reply["result_repr"] == "84"
    assert reply["error_type"] is None and reply["traceback"] is None
    assert reply["violations"] == [] and not reply["truncated"] and not reply["interrupted"]
    assert 0 <= reply["execution_time_ms"] < 10_000
    assert 0 <= reply["cpu_time_ms"] < 10_000
    assert 1 < reply["peak_memory_mb"] < 1024


def test_state_is_kept_between_calls(restricted: WorkerProcess) -> None:
    restricted.execute("def square(n):\n    return n ** 2\ntotal = 7")
    assert restricted.execute("square(total)")["result_repr"] == "49"


def test_peak_memory_is_measured_per_request(restricted: WorkerProcess) -> None:
    big = restricted.execute("b = bytearray(64 * 1024 * 1024)")
    assert big["peak_memory_mb"] >= 60
    restricted.execute("del b")
    assert restricted.execute("1")["peak_memory_mb"] < big["peak_memory_mb"] - 32


def test_errors_are_results_with_a_traceback_of_user_frames_only(
    restricted: WorkerProcess,
) -> None:
    reply = restricted.execute("def f():\n    return 1 / 0\nf()")
    assert not reply["success"] and reply["error_type"] == "ZeroDivisionError"
    assert reply["error_message"] == "division by zero"
    assert "<cell-" in reply["traceback"] and "executor.py" not in reply["traceback"]
    assert restricted.execute("this is not valid python syntax")["error_type"] == "SyntaxError"


def test_validation_and_blocked_imports_are_reported_with_their_violations(
    restricted: WorkerProcess,
) -> None:
    blocked = restricted.execute("import os")
    assert blocked["error_type"] == "import_blocked" and blocked["violations"]
    rejected = restricted.execute("().__class__.__bases__")
    assert rejected["error_type"] == "validation" and len(rejected["violations"]) == 2
    runtime = restricted.execute("import typing\ntyping.sys")
    assert runtime["error_type"] == "import_blocked"


def test_code_over_the_size_limit_is_refused_in_both_modes() -> None:
    for mode in ("restricted", "unrestricted"):
        worker = start(worker_config(mode, max_code_bytes=1000))
        try:
            reply = worker.execute("x = 1\n" * 200)
            assert reply["error_type"] == "validation"
            assert worker.execute("'é' * 2")["result_repr"] == "'éé'"
        finally:
            worker.close()


def test_pathological_code_gets_a_validation_reply_and_the_worker_survives(
    restricted: WorkerProcess,
) -> None:
    restricted.execute("alive = True")
    for code in ("(" * 5000 + ")" * 5000, "-" * 90_000 + "1", "a = 1\0", "s = '\ud800'"):
        assert restricted.execute(code)["error_type"] == "validation"
    assert restricted.execute("alive")["result_repr"] == "True"


def test_a_repr_with_a_lone_surrogate_still_makes_a_valid_reply(restricted: WorkerProcess) -> None:
    code = "class Odd:\n    def __repr__(self):\n        return 'x\\ud800'\nOdd()"
    reply = restricted.execute(code)
    assert reply["success"] and reply["result_repr"] == "x\ud800"


# --- capture --------------------------------------------------------------------------------


def test_output_of_print_fd_writes_and_children_lands_in_the_request(
    unrestricted: WorkerProcess,
) -> None:
    code = (
        "import os, subprocess, sys\n"
        "print('from print')\n"
        "os.write(1, b'from fd 1\\n')\n"
        "subprocess.run(['echo', 'from a child'])\n"
        "os.write(2, b'fd 2\\n')\n"
        "print('to stderr', file=sys.stderr)"
    )
    reply = unrestricted.execute(code)
    assert reply["stdout"] == "from print\nfrom fd 1\nfrom a child\n"
    assert reply["stderr"] == "fd 2\nto stderr\n"
    assert unrestricted.execute("print('next')")["stdout"] == "next\n"


def test_a_background_child_holding_the_pipe_does_not_stall_the_request(
    unrestricted: WorkerProcess,
) -> None:
    code = "import subprocess\nchild = subprocess.Popen(['sleep', '30'])\nprint('started')"
    try:
        reply = unrestricted.execute(code)
        assert reply["stdout"] == "started\n"
        assert reply["execution_time_ms"] < 5_000
    finally:
        unrestricted.execute("child.kill()\nchild.wait()")


def test_an_output_flood_is_truncated_with_bounded_memory(restricted: WorkerProcess) -> None:
    limit = load_policy("default").output.max_stream_bytes
    baseline = restricted.execute("1")["peak_memory_mb"]
    reply = restricted.execute("for i in range(200_000):\n    print('x' * 100)")
    assert reply["success"] and reply["truncated"]
    assert 0 < len(reply["stdout"].encode()) <= limit
    assert reply["peak_memory_mb"] < baseline + 32
    assert restricted.execute("6 * 7")["result_repr"] == "42"


def test_undecodable_output_stays_within_the_stream_limit() -> None:
    worker = start(worker_config("unrestricted", max_stream_bytes=4096))
    try:
        reply = worker.execute("import os\nos.write(1, bytes(range(128, 256)) * 100)")
        assert reply["truncated"] and "\ufffd" in reply["stdout"]
        assert len(reply["stdout"].encode()) <= 4096
    finally:
        worker.close()


def test_a_reply_never_exceeds_the_reply_limit() -> None:
    limit = 64 * 1024
    worker = start(worker_config("unrestricted", max_stream_bytes=30_000, max_reply_bytes=limit))
    try:
        request_id = worker.send(
            "execute",
            code="import os\nos.write(1, b'\\x01' * 30000)\nos.write(2, b'\\x02' * 30000)",
        )
        line = worker.lines.get(timeout=REPLY_TIMEOUT)
        assert len(line) <= limit
        reply = json.loads(line)
        assert reply["id"] == request_id and reply["truncated"]
    finally:
        worker.close()


# --- bad requests ---------------------------------------------------------------------------


BAD_LINES = {
    "not json": (b"{not json\n", None),
    "invalid utf-8": (b'{"id": "a", "op": "ping", "x": "\xff"}\n', None),
    "not an object": (b"[1, 2]\n", None),
    "missing id": (b'{"op": "ping"}\n', None),
    "id not a string": (b'{"id": 5, "op": "ping"}\n', None),
    "id too long": (json.dumps({"id": "i" * 65, "op": "ping"}).encode() + b"\n", None),
    "missing op": (b'{"id": "a"}\n', "a"),
    "unknown op": (b'{"id": "b", "op": "launch"}\n', "b"),
    "missing argument": (b'{"id": "c", "op": "execute"}\n', "c"),
    "wrong argument type": (b'{"id": "d", "op": "execute", "code": 1}\n', "d"),
    "unknown argument": (b'{"id": "e", "op": "ping", "extra": true}\n', "e"),
}


@pytest.mark.parametrize(("line", "expected_id"), BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_bad_request_gets_invalid_argument_and_the_worker_goes_on(
    restricted: WorkerProcess, line: bytes, expected_id: str | None
) -> None:
    restricted.send_line(line)
    reply = restricted.next_message()
    assert reply["type"] == "reply" and reply["id"] == expected_id
    assert not reply["ok"] and reply["error_type"] == "invalid_argument"
    assert restricted.call("ping")["pong"] is True


def test_an_over_long_request_line_is_refused_and_skipped() -> None:
    worker = start(worker_config(max_code_bytes=1000))
    try:
        worker.send_line(b'{"id": "big", "op": "execute", "code": "' + b"x" * 200_000 + b'"}\n')
        reply = worker.next_message()
        assert reply["id"] is None and reply["error_type"] == "invalid_argument"
        assert worker.call("ping")["pong"] is True
    finally:
        worker.close()


def test_blank_lines_are_ignored(restricted: WorkerProcess) -> None:
    restricted.send_line(b"\n  \n")
    assert restricted.call("ping")["pong"] is True


# --- signals --------------------------------------------------------------------------------


def test_sigint_interrupts_a_busy_loop_and_keeps_the_state(restricted: WorkerProcess) -> None:
    restricted.execute("kept = 'yes'")
    request_id = restricted.send("execute", code="while True:\n    pass")
    reply = interrupt_until_replied(restricted, request_id)
    assert reply["ok"] and reply["interrupted"] and reply["error_type"] == "KeyboardInterrupt"
    assert restricted.execute("kept")["result_repr"] == "'yes'"


def test_sigint_interrupts_a_blocking_sleep(restricted: WorkerProcess) -> None:
    request_id = restricted.send("execute", code="import time\ntime.sleep(60)")
    reply = interrupt_until_replied(restricted, request_id)
    assert reply["interrupted"] and reply["execution_time_ms"] < 30_000


def test_sigint_while_idle_is_ignored(restricted: WorkerProcess) -> None:
    for _ in range(5):
        restricted.proc.send_signal(signal.SIGINT)
    assert restricted.call("ping")["pong"] is True
    assert restricted.proc.poll() is None
    assert restricted.execute("1 + 1")["result_repr"] == "2"


def test_user_code_exiting_does_not_end_the_worker(unrestricted: WorkerProcess) -> None:
    assert unrestricted.execute("import sys\nsys.exit(3)")["error_type"] == "SystemExit"
    assert unrestricted.call("ping")["pong"] is True


# --- introspection --------------------------------------------------------------------------


def test_list_variables_names_user_values_and_modules_apart(restricted: WorkerProcess) -> None:
    restricted.execute("import math\nx = 1\n_hidden = 2\nclass Point:\n    pass\np = Point()")
    reply = restricted.call("list_variables")
    assert reply["variables"] == [
        {"name": "Point", "type": "type"},
        {"name": "p", "type": "Point"},
        {"name": "x", "type": "int"},
    ]
    assert reply["modules"] == ["math"]


def test_inspect_describes_a_value_without_failing(restricted: WorkerProcess) -> None:
    restricted.execute(
        "import collections\n"
        "def area(w: int, h: int = 2) -> int:\n"
        "    '''Area of a rectangle.\n\n    More.'''\n"
        "    return w * h\n"
        "counts = collections.Counter('aab')\n"
        "class Broken:\n"
        "    def __repr__(self):\n"
        "        raise ValueError('no')\n"
        "    def __len__(self):\n"
        "        return 3\n"
        "broken = Broken()\n"
        "big = list(range(100_000))"
    )
    area = restricted.call("inspect", name="area")
    assert area["found"] and area["type_name"] == "function"
    assert (
        area["doc"] == "Area of a rectangle." and area["signature"] == "(w: int, h: int = 2) -> int"
    )
    counts = restricted.call("inspect", name="counts")
    assert counts["type_name"] == "collections.Counter" and counts["length"] == 2
    broken = restricted.call("inspect", name="broken")
    assert broken["ok"] and "ValueError" in broken["repr_error"] and broken["length"] == 3
    big = restricted.call("inspect", name="big")
    assert big["length"] == 100_000 and len(big["repr"]) <= 2000
    missing = restricted.call("inspect", name="nothing")
    assert missing["ok"] and missing["found"] is False


def test_reset_clears_the_namespace(restricted: WorkerProcess) -> None:
    restricted.execute("x = 1\nimport math")
    assert restricted.call("reset")["ok"]
    assert restricted.call("list_variables")["variables"] == []
    assert restricted.execute("x")["error_type"] == "NameError"
    assert restricted.execute("len('abc')")["result_repr"] == "3"


def test_the_worker_takes_sigint_back_after_user_code_ignored_it(
    unrestricted: WorkerProcess,
) -> None:
    unrestricted.execute("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
    request_id = unrestricted.send("execute", code="while True:\n    pass")
    assert interrupt_until_replied(unrestricted, request_id)["interrupted"]


def test_user_hooks_raising_system_exit_never_end_the_worker(restricted: WorkerProcess) -> None:
    restricted.execute(
        "class Evil:\n"
        "    def __repr__(self):\n"
        "        raise SystemExit(1)\n"
        "class Loud(Exception):\n"
        "    def __str__(self):\n"
        "        raise SystemExit(2)\n"
        "evil = Evil()"
    )
    assert restricted.execute("evil")["error_type"] == "SystemExit"
    loud = restricted.execute("raise Loud()")
    assert loud["error_type"] == "Loud" and loud["error_message"]
    assert "SystemExit" in restricted.call("inspect", name="evil")["repr_error"]
    assert restricted.call("ping")["pong"] is True
