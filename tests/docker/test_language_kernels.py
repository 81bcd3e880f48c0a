"""The TypeScript, R and Java kernels in their templates (code-interpreter has node and Debian's
TypeScript compiler; code-interpreter-full adds R and a JDK, each built on first use from
Debian's packages), against real containers: state between cells, the last value as the
result, an error with its traceback, a cell's env, a timeout that keeps the state when the cell
stops, and one that says the state was reset when it does not; an R plot as a PNG result; a
restricted policy refusing them."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

# The templates may be built on first use (python-data's wheels, then Debian's packages for
# node and TypeScript, then R's and the JDK's: minutes each, over 15 on a loaded host).
FIRST_CALL_TIMEOUT = 1800
pytestmark = [
    pytest.mark.docker,
    pytest.mark.anyio,
    pytest.mark.timeout(FIRST_CALL_TIMEOUT + 600),
]
CALL_TIMEOUT = 120
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def session(orch: Orchestrator, policy: str) -> str:
    with anyio.fail_after(FIRST_CALL_TIMEOUT):
        made = await orch.execute("1", policy=policy)
    assert made.success, made
    return made.session_id


async def run(orch: Orchestrator, sid: str, language: str, code: str, **arguments: Any) -> Any:
    with anyio.fail_after(CALL_TIMEOUT):
        answer = await orch.call(
            "python_repl",
            {"operation": "execute", "session_id": sid, "context": language, "code": code,
             **arguments},
        )  # fmt: skip
    return answer.structured


async def test_typescript_keeps_state_strips_types_and_reports_errors(orch: Orchestrator) -> None:
    sid = await session(orch, "code-interpreter")
    first = await run(orch, sid, "ts", "const message: string = 'Hello'\nconsole.log(message)")
    assert first["success"] and first["stdout"] == "Hello\n", first
    typed = await run(
        orch, sid, "typescript",
        "interface Point { x: number }\nfunction norm(p: Point): number { return p.x * 2 }\n"
        "norm({ x: 21 })",
    )  # fmt: skip
    assert typed["result_repr"] == "42", typed
    assert (await run(orch, sid, "ts", "message.length + norm({ x: 1 })"))["result_repr"] == "7"
    imported = await run(orch, sid, "ts", "import { join } from 'path'\njoin('a', 'b')")
    assert imported["result_repr"] == "'a/b'", imported
    awaited = await run(orch, sid, "ts", "const n: number = await Promise.resolve(5)\nn + 1")
    assert awaited["result_repr"] == "6", awaited
    env = await run(orch, sid, "ts", "process.env.FOO", env={"FOO": "bar"})
    assert env["result_repr"] == "'bar'", env
    assert (await run(orch, sid, "ts", "process.env.FOO"))["result_repr"] is None
    failed = await run(orch, sid, "ts", "function boom(): never { throw new TypeError('no') }\n"
                                        "boom()")  # fmt: skip
    assert failed["error_type"] == "TypeError" and "at boom" in failed["traceback"], failed
    broken = await run(orch, sid, "ts", "let = = 1")
    assert broken["error_type"] == "SyntaxError" and not broken["success"], broken
    spinning = await run(orch, sid, "ts", "while (true) {}", timeout_s=1)
    assert spinning["timed_out"] and spinning["state_reset"] is True, spinning
    assert (await run(orch, sid, "ts", "typeof message"))["result_repr"] == "'undefined'"


async def test_r_keeps_state_answers_values_plots_and_errors(orch: Orchestrator) -> None:
    sid = await session(orch, "code-interpreter-full")
    first = await run(orch, sid, "r", 'x <- 41\nprint("Hello")\nx + 1')
    assert first["success"] and first["stdout"] == '[1] "Hello"\n', first
    assert first["result_repr"] == "[1] 42" and first["results"][0]["is_main_result"], first
    assert (await run(orch, sid, "r", "f <- function(n) n * 2\nf(x)"))["result_repr"] == "[1] 82"
    env = await run(orch, sid, "r", "Sys.getenv('FOO')", env={"FOO": "bar"})
    assert env["result_repr"] == '[1] "bar"', env
    unset = await run(orch, sid, "r", "Sys.getenv('FOO', unset = 'default')")
    assert unset["result_repr"] == '[1] "default"', unset
    assert (await run(orch, sid, "r", "getwd()"))["result_repr"] == '[1] "/workspace"'
    failed = await run(orch, sid, "r", "g <- function() stop('no way')\ng()")
    assert not failed["success"] and failed["error_message"] == "no way", failed
    assert "g()" in failed["traceback"], failed
    broken = await run(orch, sid, "r", "x <- (")
    assert broken["error_type"] == "SyntaxError", broken
    plotted = await run(orch, sid, "r", "plot(1:10)")
    images = [r["image/png"] for r in plotted["results"] if "image/png" in r]
    assert plotted["success"] and len(images) == 1, plotted
    assert base64.b64decode(images[0]).startswith(PNG_MAGIC)
    sleeping = await run(orch, sid, "r", "Sys.sleep(30)", timeout_s=1)
    assert sleeping["timed_out"] and sleeping["state_reset"] is False, sleeping
    assert (await run(orch, sid, "r", "x"))["result_repr"] == "[1] 41"
    stubborn = "repeat tryCatch(repeat {}, interrupt = function(e) NULL)"
    spinning = await run(orch, sid, "r", stubborn, timeout_s=1)
    assert spinning["timed_out"] and spinning["state_reset"] is True, spinning
    assert (await run(orch, sid, "r", "exists('x')"))["result_repr"] == "[1] FALSE"


async def test_java_keeps_state_answers_values_and_errors(orch: Orchestrator) -> None:
    sid = await session(orch, "code-interpreter-full")
    first = await run(orch, sid, "java", 'int x = 41;\nSystem.out.println("Hello");\nx + 1')
    assert first["success"] and first["stdout"] == "Hello\n", first
    assert first["result_repr"] == "42" and first["results"][0]["is_main_result"], first
    method = await run(orch, sid, "java", "int twice(int n) { return n * 2; }\ntwice(x)")
    assert method["result_repr"] == "82", method
    env = await run(orch, sid, "java", 'System.getProperty("FOO")', env={"FOO": "bar"})
    assert env["result_repr"] == "bar", env
    unset = await run(orch, sid, "java", 'System.getProperty("FOO", "default")')
    assert unset["result_repr"] == "default", unset
    failed = await run(orch, sid, "java", 'Integer.parseInt("nope")')
    assert failed["error_type"] == "NumberFormatException", failed
    assert "at java.base/java.lang.Integer.parseInt" in failed["traceback"], failed
    wrong = await run(orch, sid, "java", 'int y = "text";')
    assert wrong["error_type"] == "CompilationError" and "incompatible" in wrong["error_message"]
    looping = await run(orch, sid, "java", "while (true) {}", timeout_s=2)
    assert looping["timed_out"] and looping["state_reset"] is False, looping
    assert (await run(orch, sid, "java", "x"))["result_repr"] == "41"
    stubborn = "while (true) { try { while (true) {} } catch (Throwable t) { } }"
    spinning = await run(orch, sid, "java", stubborn, timeout_s=2)
    assert spinning["timed_out"] and spinning["state_reset"] is True, spinning
    gone = await run(orch, sid, "java", "x")
    assert gone["error_type"] == "CompilationError", gone


@pytest.mark.parametrize("language", ["typescript", "r", "java"])
async def test_a_restricted_policy_refuses_other_languages(
    orch: Orchestrator, language: str
) -> None:
    made = await orch.execute("1", policy="default")
    refused = await run(orch, made.session_id, language, "1")
    assert refused["error_type"] == "policy" and refused["rule"] == "python.mode", refused
    assert "restricted" in refused["error_message"]
