"""Replies forged inside the sandbox decide nothing on the host. Everything in a container runs as
the sandbox user, so user code can stop a helper and write its own reply to the helper's stdout
(through /proc/PID/fd/1); here it does exactly that, from an ``unrestricted-python`` session."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator._api import Orchestrator
from orchestrator.audit._log import verify
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

POLICY = "unrestricted-python"
READY = "/tmp/forger-ready"  # inside the container
FORGED = "/tmp/forged"

# Waits for the next run of the file helper's `archive`, stops it, writes REPLY (a placeholder
# replaced below) to its stdout and kills it, so the host reads the forged reply and then EOF.
FORGER = """
import os, signal, sys, time
reply = REPLY
open(READY, "w").close()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"fileops.py\\0archive\\0" in cmd:
            os.kill(int(pid), signal.SIGSTOP)
            fd = os.open(f"/proc/{pid}/fd/1", os.O_WRONLY)
            os.write(fd, reply)
            os.close(fd)
            os.kill(int(pid), signal.SIGKILL)
            open(FORGED, "w").close()
            sys.exit(0)
"""


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def ok(orch: Orchestrator, tool: str, **args: Any) -> dict[str, Any]:
    result = await orch.call(tool, args)
    assert result.structured["success"], result.structured
    return result.structured


def forged_tar(*members: tuple[str, bytes, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            data = None
            if kind == tarfile.REGTYPE:
                info.size, data = 6, io.BytesIO(b"pwned\n")
            tar.addfile(info, data)
    return buffer.getvalue()


def forger_code(archive: bytes) -> str:
    """A cell that starts the forger in its own session and returns once it is watching."""
    b64 = base64.b64encode(archive).decode()
    reply = {"ok": True, "path": "/workspace/f", "size": len(archive), "archive_b64": b64}
    script = (
        FORGER.replace("REPLY", repr(json.dumps(reply).encode()))
        .replace("READY", repr(READY))
        .replace("FORGED", repr(FORGED))
    )
    return (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {script!r}], start_new_session=True)\n"
        "deadline = time.monotonic() + 20\n"
        f"while not os.path.exists({READY!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        f"os.path.exists({READY!r})"
    )


@pytest.mark.parametrize(
    "members",
    [
        [("../../../../tmp/x", tarfile.REGTYPE, ""), ("/tmp/y", tarfile.REGTYPE, "")],
        [("f", tarfile.DIRTYPE, ""), ("f/out", tarfile.SYMTYPE, "/etc")],
        [("f", tarfile.DIRTYPE, ""), ("f/up", tarfile.SYMTYPE, "../../../../tmp")],
    ],
    ids=["climbing-and-absolute-names", "absolute-link-out", "climbing-link-out"],
)
async def test_a_forged_download_is_refused_and_every_session_keeps_working(
    members: list[tuple[str, bytes, str]], orch: Orchestrator
) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="1", policy=POLICY))[
        "session_id"
    ]
    other = (await ok(orch, "python_repl", operation="execute", code="2"))["session_id"]
    await ok(orch, "files", operation="write", session_id=sid, path="f/a.txt", content="mine")
    code = forger_code(forged_tar(*members))
    started = await ok(orch, "python_repl", operation="execute", session_id=sid, code=code)
    assert started["result_repr"] == "True"

    refused = await orch.call("files", {"operation": "download", "session_id": sid, "path": "f"})

    assert refused.structured["success"] is False
    assert refused.structured["error_type"] == "internal"
    assert "tar_b64" not in refused.structured
    forged = f"import os; os.path.exists({FORGED!r})"
    check = await ok(orch, "python_repl", operation="execute", session_id=sid, code=forged)
    assert check["result_repr"] == "True"  # the reply the host refused was the forger's
    again = await ok(orch, "files", operation="download", session_id=sid, path="f")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(again["tar_b64"]))) as tar:
        assert sorted(tar.getnames()) == ["f", "f/a.txt"]
    assert (await ok(orch, "python_repl", operation="execute", session_id=other, code="3"))[
        "result_repr"
    ] == "3"


def forged_reply_cell(error_type: str) -> str:
    """A cell that answers its own request with a forged reply on the worker's protocol fd (it
    finds the worker and the request through the interpreter), then ends the worker."""
    return (
        "import gc, json, os, sys\n"
        "worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')\n"
        "frame = sys._getframe()\n"
        "while frame.f_code.co_name != 'handle':\n"
        "    frame = frame.f_back\n"
        "reply = {'type': 'reply', 'id': frame.f_locals['request'].id, 'ok': True,\n"
        f"         'success': False, 'error_type': {error_type!r},\n"
        "         'error_message': 'code rejected', 'execution_time_ms': 0,\n"
        "         'cpu_time_ms': 0, 'peak_memory_mb': 0}\n"
        "os.write(worker._out, json.dumps(reply).encode() + b'\\n')\n"
        "os._exit(0)\n"
    )


def call_records(directory: Path) -> list[dict[str, Any]]:
    lines = []
    for segment in sorted(directory.glob("audit-*.jsonl")):
        lines += [json.loads(line) for line in segment.read_text().splitlines()]
    return [record for record in lines if record["kind"] == "call"]


async def test_the_audit_log_keeps_a_forged_cell_reply_apart_as_the_workers_claim(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    async with Orchestrator(config(worker_image.tag, audit_dir=tmp_path)) as orch:
        sid = (await ok(orch, "python_repl", operation="execute", code="1", policy=POLICY))[
            "session_id"
        ]
        execute = {"operation": "execute", "session_id": sid}
        claimed = await orch.call(
            "python_repl", {**execute, "code": forged_reply_cell("validation")}
        )
        posing = await orch.call("python_repl", {**execute, "code": forged_reply_cell("timeout")})
        after = await ok(orch, "python_repl", operation="execute", session_id=sid, code="6 * 7")
    # The caller hears what the worker said (the worker is the caller's own code)...
    assert claimed.structured["error_type"] == "validation"
    # ...but a worker posing as the host (a timeout it did not time) breaks the protocol.
    assert posing.structured["error_type"] == "process_crashed"
    assert after["result_repr"] == "42" and after["state_reset"]
    assert verify(tmp_path).ok
    records = call_records(tmp_path)
    outcomes = [
        (r["success"], r["error_type"], r["ran"], r.get("worker_claims", {}).get("error_type"))
        for r in records
    ]
    assert outcomes == [
        (True, None, True, None),
        (True, None, True, "validation"),
        (False, "process_crashed", True, None),
        (True, None, True, None),
    ]
    assert records[1]["worker_claims"]["success"] is False
    assert records[3]["worker_claims"] == {
        key: after[key]
        for key in (
            "success",
            "error_type",
            "execution_time_ms",
            "cpu_time_ms",
            "peak_memory_mb",
            "truncated",
        )
    }


def raw_reply_cell(numbers: str) -> str:
    """A cell that answers its own request with a hand-written reply line whose timings are
    ``numbers`` (JSON text a well-behaved encoder would never write), then ends the worker."""
    return (
        "import gc, os, sys\n"
        "worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')\n"
        "frame = sys._getframe()\n"
        "while frame.f_code.co_name != 'handle':\n"
        "    frame = frame.f_back\n"
        "rid = frame.f_locals['request'].id\n"
        'line = (\'{"type": "reply", "id": "%s", "ok": true, "success": true, \'\n'
        f"        '{numbers}}}\\n') % rid\n"
        "os.write(worker._out, line.encode())\n"
        "os._exit(0)\n"
    )


@pytest.mark.parametrize(
    "numbers",
    [
        '"execution_time_ms": ' + "9" * 5000 + ', "cpu_time_ms": 0, "peak_memory_mb": 0',
        '"execution_time_ms": 0, "cpu_time_ms": Infinity, "peak_memory_mb": 0',
        '"execution_time_ms": 0, "cpu_time_ms": 0, "peak_memory_mb": 1e999',
    ],
    ids=["5000-digit-integer", "infinity", "overflowing-float"],
)
async def test_a_forged_frame_with_numbers_out_of_bounds_is_a_crash_of_that_worker_only(
    numbers: str, orch: Orchestrator
) -> None:
    sid = (await ok(orch, "python_repl", operation="execute", code="1", policy=POLICY))[
        "session_id"
    ]
    other = (await ok(orch, "python_repl", operation="execute", code="2"))["session_id"]
    execute = {"operation": "execute", "session_id": sid}

    forged = await orch.call("python_repl", {**execute, "code": raw_reply_cell(numbers)})

    assert forged.structured["error_type"] == "process_crashed"
    json.dumps(forged.structured, allow_nan=False)  # what every interface can send
    again = await ok(orch, "python_repl", operation="execute", session_id=sid, code="6 * 7")
    assert again["result_repr"] == "42" and again["state_reset"]
    assert (await ok(orch, "python_repl", operation="execute", session_id=other, code="3"))[
        "result_repr"
    ] == "3"
