"""Run inside a virtualenv holding one pinned E2B SDK (``tests/docker/e2b_venv.py``), not in
sandhold's own: one scenario through the SDK against the server the three variables name,
printed as one JSON object of what the SDK answered, for the test to check.

``python e2b_sdk_driver.py SCENARIO`` with ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY`` set; a scenario that raises exits non-zero with the traceback on stderr.
Only the SDK's public API is used, as agent code uses it."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from e2b import CommandExitException, NotFoundException, Sandbox, SandboxQuery

# How long a sandbox made with a 3 s timeout may take to be reported gone: the server's reaper
# runs every second; the rest is room for a loaded machine.
GONE_WITHIN = 60.0
SHORT_TIMEOUT = 3


def lifecycle() -> dict[str, Any]:
    """Create with metadata and envs, find, list by metadata, pause and resume by connecting,
    kill."""
    run = uuid.uuid4().hex[:8]
    made = Sandbox.create(metadata={"run": run, "n": "1"}, envs={"FROM_CREATE": "yes"}, timeout=120)
    other = Sandbox.create(metadata={"run": run, "n": "2"})
    seen: dict[str, Any] = {"sdk": importlib.metadata.version("e2b")}
    try:
        info = made.get_info()
        seen["info"] = {
            "id_matches": info.sandbox_id == made.sandbox_id,
            "template": info.template_id,
            "metadata": info.metadata,
            "lifetime": (info.end_at - info.started_at).total_seconds(),
            "state": str(getattr(info.state, "value", info.state)),
        }
        by_n = Sandbox.list(query=SandboxQuery(metadata={"n": "1", "run": run})).next_items()
        by_run = Sandbox.list(query=SandboxQuery(metadata={"run": run})).next_items()
        seen["listed_n1"] = [s.sandbox_id == made.sandbox_id for s in by_n]
        seen["listed_run"] = sorted(s.sandbox_id for s in by_run) == sorted(
            [made.sandbox_id, other.sandbox_id]
        )
        seen["commands"] = commands(made)
        seen["files"] = files(made)
        seen["paused"] = paused(made)
    finally:
        seen["killed"] = made.kill()
        other.kill()
    seen["killed_again"] = Sandbox.kill(made.sandbox_id)
    try:
        Sandbox.get_info(made.sandbox_id)
        seen["found_after_kill"] = True
    except NotFoundException:
        seen["found_after_kill"] = False
    seen["listed_after_kill"] = len(
        Sandbox.list(query=SandboxQuery(metadata={"run": run})).next_items()
    )
    return seen


def commands(sandbox: Sandbox) -> dict[str, Any]:
    ran = sandbox.commands.run(
        'echo out; echo err >&2; echo "$GREETING $FROM_CREATE"', envs={"GREETING": "hello"}
    )
    try:
        sandbox.commands.run("echo why >&2; exit 3")
        failed: dict[str, Any] = {"raised": False}
    except CommandExitException as exc:
        failed = {"raised": True, "exit_code": exc.exit_code, "stderr": exc.stderr}
    return {
        "exit_code": ran.exit_code,
        "stdout": ran.stdout,
        "stderr": ran.stderr,
        "failed": failed,
    }


def files(sandbox: Sandbox) -> dict[str, Any]:
    written = sandbox.files.write("notes/a.txt", "text one")
    sandbox.files.write("/home/user/b.bin", b"\x00\xffbytes")
    return {
        "written_path": written.path,
        "text": sandbox.files.read("notes/a.txt"),
        "bytes": list(bytes(sandbox.files.read("b.bin", format="bytes"))),
        "listed": sorted(
            [e.name, str(getattr(e.type, "value", e.type))]
            for e in sandbox.files.list("/home/user")
        ),
        "exists": [sandbox.files.exists("notes/a.txt"), sandbox.files.exists("nothing")],
    }


def paused(sandbox: Sandbox) -> dict[str, Any]:
    """``beta_pause`` (both pinned versions have it), the state listed, then ``connect``, which
    resumes a paused sandbox; what the sandbox held before is still there."""
    # Commands run in the container's real working directory, which files.* call /home/user.
    sandbox.commands.run("echo kept > kept.txt")
    first = sandbox.beta_pause()
    again = sandbox.beta_pause()
    state = Sandbox.get_info(sandbox.sandbox_id).state
    resumed = Sandbox.connect(sandbox.sandbox_id)
    return {
        "first": first,
        "again": again,
        "state": str(getattr(state, "value", state)),
        "running_after_connect": resumed.is_running(),
        "kept": resumed.files.read("/home/user/kept.txt"),
    }


def expiry() -> dict[str, Any]:
    """A sandbox made with a short timeout is running at first and gone after it."""
    made = Sandbox.create(timeout=SHORT_TIMEOUT)
    seen: dict[str, Any] = {"running_at_first": made.is_running()}
    deadline = time.monotonic() + GONE_WITHIN
    while made.is_running() and time.monotonic() < deadline:
        time.sleep(0.5)
    seen["running_at_end"] = made.is_running()
    try:
        Sandbox.get_info(made.sandbox_id)
        seen["found"] = True
    except NotFoundException:
        seen["found"] = False
    return seen


def run_code() -> dict[str, Any]:
    """The code interpreter SDK of the same venv: state kept between cells, stdout, an error."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    # code-interpreter-v1 is sandhold's code-interpreter template, built on first use.
    made = CodeSandbox.create(request_timeout=600)
    try:
        made.run_code("x = 41")
        ran = made.run_code("print('hi')\nx + 1")
        failed = made.run_code("1 / 0")
        return {
            "sdk": importlib.metadata.version("e2b-code-interpreter"),
            "text": ran.text,
            "stdout": ran.logs.stdout,
            "error": failed.error.name if failed.error else None,
        }
    finally:
        made.kill()


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "lifecycle": lifecycle,
    "expiry": expiry,
    "run_code": run_code,
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]]()))
