"""The scripted model every framework test drives: a script is the model's side of one agent run,
a sequence of tool calls each chosen from what the framework showed the model of the last result.
Each framework test wraps a script in that framework's own test model (pydantic-ai's
``FunctionModel``, an openai-agents ``Model``, a langchain chat model) or, for the plain clients,
feeds it their results; the test then asserts on the script's transcript.

What the model is shown is either the structured content (a dict; pydantic-ai's default) or text
(the text content, or the framework's error message); ids and fields are read from the text the
way a model would read them, from its ``name: value`` lines (``orchestrator.tools._text``).

Standard library only: the langchain test imports this module in its own virtualenv.
"""

from __future__ import annotations

import base64
import io
import json
import re
import tarfile
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

# Outsleeps every bound of the tests: a next call answered in time proves the cell was
# interrupted, not waited out. ``timeout_s`` past those bounds too, so the cell's own timeout
# cannot pass for the interrupt.
LONG_CELL = "y = 1\nimport time\ntime.sleep(600)"
LONG_CELL_TIMEOUT_S = 300
# The task a share grants to, and the one close_owner closes when the caller has no task.
OTHER_TASK = "framework-test-other"

Seen = dict[str, Any] | str


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]


@dataclass
class Step:
    call: Call
    seen: Seen


def as_result(seen: Seen) -> Seen:
    """A result the framework showed as JSON text (pydantic-ai's retry prompt is
    ``{"error": "<the result as JSON>"}``; mcp-use shows a failed call as ``{"error":
    "RuntimeError", "details": "<the result's text>"}``) read as what it holds; any other text
    as it is."""
    if isinstance(seen, dict) or not seen.startswith("{"):
        return seen
    try:
        parsed = json.loads(seen)
    except ValueError:
        return seen
    if isinstance(parsed, dict) and "success" in parsed:
        return parsed
    if isinstance(parsed, dict) and isinstance(parsed.get("details"), str):
        return as_result(parsed["details"])
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return as_result(parsed["error"])
    return seen


def outcome(seen: Seen) -> str:
    """``ok`` or the result's error_type; ``framework_error`` for what is no result of ours (a
    client timeout the framework reports in its own words)."""
    seen = as_result(seen)
    if isinstance(seen, dict):
        return "ok" if seen.get("success") else str(seen.get("error_type"))
    first = seen.split("\n", 1)[0]
    # Our text's first line, or a framework's report of a failed call that quotes it (fastmcp
    # raises ToolError for a call our server marked isError: "... raised ToolError: <line>").
    found = re.fullmatch(r"(?:the tool call raised \w+: )?\w+\.\w+: (\w+)", first)
    return found.group(1) if found else "framework_error"


def read(seen: Seen, name: str) -> Any:
    """Field ``name`` of a result, as a model reads it: from the dict, or from the text's
    ``name: value`` line (a JSON scalar where it parses as one) or ``name:`` block."""
    seen = as_result(seen)
    if isinstance(seen, dict):
        return seen.get(name)
    lines = seen.split("\n")
    for index, line in enumerate(lines):
        if line == f"{name}:":
            return "\n".join(lines[index + 1 :])
        if line.startswith(f"{name}: "):
            value = line.removeprefix(f"{name}: ")
            try:
                return json.loads(value)
            except ValueError:
                return value
    return None


@dataclass
class Script:
    """One agent run's model: ``start()`` gives the first call, ``step(seen)`` the next after the
    framework showed ``seen``; ``None`` ends the run. ``transcript`` keeps every exchange."""

    plan: Callable[[Script], Generator[Call, Seen, None]]
    transcript: list[Step] = field(default_factory=list)
    finished: bool = False
    _gen: Generator[Call, Seen, None] | None = None

    def start(self) -> Call | None:
        self._gen = self.plan(self)
        return self._advance(None)

    def step(self, seen: Seen) -> Call | None:
        return self._advance(seen)

    def _advance(self, seen: Seen | None) -> Call | None:
        assert self._gen is not None
        try:
            if seen is None:
                return next(self._gen)
            return self._gen.send(seen)
        except StopIteration:
            self.finished = True
            return None

    def ask(self, call: Call) -> Generator[Call, Seen, Seen]:
        """Within a plan: make ``call`` and get what the framework showed of its result."""
        seen = yield call
        self.transcript.append(Step(call, seen))
        return seen

    def outcomes(self) -> list[tuple[str, str, str]]:
        return [
            (s.call.tool, str(s.call.arguments.get("operation")), outcome(s.seen))
            for s in self.transcript
        ]


def execute(code: str, session_id: str | None = None, **more: Any) -> Call:
    return Call(
        "python_repl", {"operation": "execute", "code": code, "session_id": session_id, **more}
    )


# -- the plans ----------------------------------------------------------------------------------


def kept_session(script: Script) -> Generator[Call, Seen, None]:
    """A session made by the first call and named by every later one, the id read from what the
    framework showed; two failing cells in a row, then the session still holds its state."""
    created = yield from script.ask(execute("x = 41"))
    session_id = read(created, "session_id")
    yield from script.ask(execute("x + 1", session_id))
    yield from script.ask(execute("1 / 0", session_id))
    yield from script.ask(execute("undefined_name", session_id))
    yield from script.ask(execute("x", session_id))


def outlasting_the_client(script: Script) -> Generator[Call, Seen, None]:
    """A cell longer than the client waits, then a call that finds the session's state."""
    created = yield from script.ask(execute("x = 41"))
    session_id = read(created, "session_id")
    yield from script.ask(execute(LONG_CELL, session_id, timeout_s=LONG_CELL_TIMEOUT_S))
    yield from script.ask(execute("x + y", session_id))


def abandoned_cell(script: Script) -> Generator[Call, Seen, None]:
    """A client that gives up on a long cell and sends no cancel (mcp 1.x): the next call is
    told the session is busy and with what, ``interrupt`` stops the cell, the state is kept and
    the cell is in the history; then a second long cell is given up on, and the run ends with
    it still running (the client closes with a call in flight)."""
    created = yield from script.ask(execute("x = 41"))
    session_id = read(created, "session_id")
    yield from script.ask(execute(LONG_CELL, session_id, timeout_s=LONG_CELL_TIMEOUT_S))
    yield from script.ask(execute("x + y", session_id))
    yield from script.ask(Call("python_repl", {"operation": "interrupt", "session_id": session_id}))
    yield from script.ask(execute("x + y", session_id))
    yield from script.ask(Call("python_repl", {"operation": "history", "session_id": session_id}))
    yield from script.ask(execute(LONG_CELL, session_id, timeout_s=LONG_CELL_TIMEOUT_S))


def a_tar(name: str, content: bytes) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(content)
        archive.addfile(info, io.BytesIO(content))
    return base64.b64encode(buffer.getvalue()).decode()


# Operations that commit a container (a snapshot, and what needs one): left out of the
# every-operation plan (see conftest.every_operation).
COMMITTING = frozenset(
    {("session", "snapshot"), ("session", "fork"), ("session", "delete_snapshot")}
)


def every_operation(
    fields: dict[str, list[str]], task: str | None
) -> Callable[[Script], Generator[Call, Seen, None]]:
    """Every operation of every tool, each with every field of its tool present: null unless the
    operation needs it, as a strict-mode model fills a schema. ``fields``: each tool's input
    schema properties, as the framework listed them. ``task``: the caller's task, if the
    transport names one; without one, ``share`` is refused (it is made by a task), so it is
    made a second time with its required fields alone, to be refused the same way."""

    def call(tool: str, operation: str, **given: Any) -> Call:
        arguments: dict[str, Any] = {name: None for name in fields[tool]}
        return Call(tool, {**arguments, "operation": operation, **given})

    def plan(script: Script) -> Generator[Call, Seen, None]:
        ask = script.ask
        created = yield from ask(call("python_repl", "execute", code="z = [1, 2]"))
        sid = read(created, "session_id")
        yield from ask(call("python_repl", "list_sessions"))
        yield from ask(call("python_repl", "history", session_id=sid))
        yield from ask(call("python_repl", "history_context", session_id=sid))
        yield from ask(call("python_repl", "inspect", session_id=sid, variable_name="z"))
        yield from ask(call("python_repl", "list_variables", session_id=sid))
        yield from ask(call("python_repl", "interrupt", session_id=sid))
        made = yield from ask(call("python_repl", "create_context", session_id=sid))
        context = (read(made, "context") or {}).get("id")
        yield from ask(call("python_repl", "list_contexts", session_id=sid))
        yield from ask(call("python_repl", "restart_context", session_id=sid, context=context))
        yield from ask(call("python_repl", "remove_context", session_id=sid, context=context))
        yield from ask(call("session", "snapshots"))

        started = yield from ask(call("terminal", "start", command="cat", session_id=sid))
        tid = read(started, "terminal_id")
        yield from ask(call("terminal", "write", terminal_id=tid, input_text="hi\n"))
        yield from ask(call("terminal", "read", terminal_id=tid))
        yield from ask(call("terminal", "wait", terminal_id=tid))
        yield from ask(call("terminal", "resize", terminal_id=tid, rows=30, cols=100))
        grant = {"terminal_id": tid, "task": OTHER_TASK, "actions": ["read"]}
        yield from ask(call("session", "share", **grant))
        # pause and resume between: a framework counts failures of a tool in a row (share's
        # refusal without a task is one), and gives up after too many.
        yield from ask(call("session", "pause", session_id=sid))
        if task is None:
            yield from ask(Call("session", {"operation": "share", **grant}))
        yield from ask(call("session", "resume", session_id=sid))
        yield from ask(call("session", "network_log", session_id=sid))
        # The default policy has no network: refused (policy), between two answers, as share is.
        yield from ask(call("session", "set_allowlist", session_id=sid, allow=["pypi.org"]))
        yield from ask(call("session", "metrics", session_id=sid))
        yield from ask(call("session", "set_timeout", session_id=sid, timeout_s=600))
        labels = ["purpose=scenario"]  # the NAME=value form strict schemas take
        other = yield from ask(call("session", "create", metadata=labels))
        yield from ask(call("python_repl", "destroy", session_id=read(other, "session_id")))
        yield from ask(call("terminal", "interrupt", terminal_id=tid))
        yield from ask(call("terminal", "kill", terminal_id=tid))
        yield from ask(call("terminal", "run", command="echo ran", session_id=sid))

        began = yield from ask(call("process", "start", command="sleep 60", session_id=sid))
        pid = read(began, "process_id")
        yield from ask(call("process", "list"))
        yield from ask(call("process", "read_output", process_id=pid))
        yield from ask(call("process", "kill", process_id=pid))

        yield from ask(call("files", "write", session_id=sid, path="a.txt", content="hello"))
        yield from ask(call("files", "read", session_id=sid, path="a.txt"))
        yield from ask(call("files", "list", session_id=sid))
        yield from ask(call("files", "stat", session_id=sid, path="a.txt"))
        yield from ask(call("files", "exists", session_id=sid, path="a.txt"))
        yield from ask(call("files", "make_dir", session_id=sid, path="old"))
        yield from ask(call("files", "rename", session_id=sid, path="a.txt", new_path="old/a.txt"))
        yield from ask(call("files", "remove", session_id=sid, path="old", recursive=True))
        yield from ask(call("files", "write", session_id=sid, path="a.txt", content="hello"))
        yield from ask(call("files", "download", session_id=sid, path="a.txt"))
        tar = a_tar("b.txt", b"uploaded")
        yield from ask(call("files", "upload", session_id=sid, path=".", tar_b64=tar))

        yield from ask(call("python_repl", "reset", session_id=sid))
        yield from ask(call("python_repl", "destroy", session_id=sid))
        # Last: it ends what the task owns and seals it.
        yield from ask(call("session", "close_owner", task=task or OTHER_TASK))

    return plan


# -- what each plan must have seen --------------------------------------------------------------


def text_of(value: Any) -> str:
    return "" if value is None else str(value)


def check_kept_session(script: Script) -> None:
    """One session throughout: every call after the first named it and found its state; the
    two failing cells were answers (their exception types), and the run went on past them."""
    assert script.finished, script.outcomes()
    created, plus_one, divide, undefined, after = (step.seen for step in script.transcript)
    session_id = read(created, "session_id")
    assert outcome(created) == "ok" and session_id and read(created, "created_new_session") is True
    assert [s.call.arguments["session_id"] for s in script.transcript[1:]] == [session_id] * 4
    assert outcome(plus_one) == "ok" and text_of(read(plus_one, "result_repr")) == "42", plus_one
    assert outcome(divide) == "ZeroDivisionError", divide
    assert outcome(undefined) == "NameError", undefined
    assert outcome(after) == "ok" and text_of(read(after, "result_repr")) == "41", after
    for seen in (plus_one, divide, undefined, after):
        assert read(seen, "session_id") == session_id and not read(seen, "created_new_session")


def check_outlasting_the_client(script: Script) -> None:
    """The client gave up on the long cell (the framework showed the model its own error, not
    a result); the next call found the session idle, with what was set before and during the
    interrupted cell, and its state kept."""
    assert script.finished, script.outcomes()
    created, long_cell, after = (step.seen for step in script.transcript)
    assert outcome(created) == "ok", created
    assert outcome(long_cell) == "framework_error", long_cell
    assert outcome(after) == "ok" and text_of(read(after, "result_repr")) == "42", after
    assert read(after, "state_reset") is False, after


def check_abandoned_cell(script: Script) -> None:
    """The client's own timeout ended the long cell's call (twice, the second time just before
    it closed); the call after it answered ``busy`` naming the running call; ``interrupt`` stopped
    that cell with the state kept, and the history has it as ``cancelled``."""
    assert script.finished, script.outcomes()
    created, gave_up, busy, interrupted, after, history, gave_up_again = (
        step.seen for step in script.transcript
    )
    assert outcome(created) == "ok", created
    for timed_out in (gave_up, gave_up_again):
        assert outcome(timed_out) == "framework_error", timed_out
        assert "timed out" in text_of(timed_out).lower(), timed_out
    assert outcome(busy) == "busy", busy
    assert "python_repl.execute has run for" in text_of(read(busy, "error_message")), busy
    assert outcome(interrupted) == "ok" and read(interrupted, "interrupted") is True, interrupted
    assert read(interrupted, "running") == "python_repl.execute", interrupted
    assert outcome(after) == "ok" and text_of(read(after, "result_repr")) == "42", after
    assert read(after, "state_reset") is False, after
    assert outcome(history) == "ok" and "cancelled" in text_of(read(history, "history")), history


def check_every_operation(
    script: Script, task: str | None, operations: set[tuple[str, str]]
) -> None:
    """Every operation (``operations``: every tool's, as the server has them) answered ok with
    null in every field it does not use; without a task, ``share`` was refused exactly as it
    is with its required fields alone."""
    assert script.finished, script.outcomes()
    made = {(s.call.tool, s.call.arguments["operation"]) for s in script.transcript}
    assert made == operations
    shares = [s for s in script.transcript if s.call.arguments["operation"] == "share"]
    [allowlist] = [s for s in script.transcript if s.call.arguments["operation"] == "set_allowlist"]
    assert outcome(allowlist.seen) == "policy", allowlist.seen
    others = [s for s in script.transcript if s not in shares and s is not allowlist]
    assert [(s.call.tool, s.call.arguments["operation"], outcome(s.seen)) for s in others] == [
        (s.call.tool, s.call.arguments["operation"], "ok") for s in others
    ]
    if task is not None:
        [share] = shares
        assert outcome(share.seen) == "ok", share.seen
        return
    with_nulls, required_only = (s.seen for s in shares)
    assert outcome(with_nulls) == outcome(required_only) == "invalid_argument", with_nulls
    assert read(with_nulls, "error_message") == read(required_only, "error_message")


def transcript_json(script: Script) -> list[dict[str, Any]]:
    return [
        {"tool": s.call.tool, "arguments": s.call.arguments, "seen": s.seen}
        for s in script.transcript
    ]


def from_transcript_json(rows: list[dict[str, Any]], finished: bool) -> Script:
    """A script as another process ran it (the langchain test's virtualenv)."""
    script = Script(kept_session, finished=finished)
    script.transcript = [Step(Call(r["tool"], r["arguments"]), r["seen"]) for r in rows]
    return script
