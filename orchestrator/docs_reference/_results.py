"""What each operation answers, for the tool reference: the fields its handler sets itself and
the result model whose fields follow, with what every field means.

The models (``ExecuteResult``, ``TerminalResult``, ``ProcessInfo``, ...) declare the fields and
their types; the meanings are kept here, per model, and ``result_fields`` refuses a model field
without one and a meaning for a field no model has, so the page cannot fall behind a model. That
each operation's answer holds only the fields listed is checked against real containers
(tests/docker/test_docs_results.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel

from orchestrator._core.repl_operations import ExecuteResult, InterruptResult
from orchestrator.session.files.operations import (
    DownloadResult,
    ExistsResult,
    FileEntry,
    ListResult,
    MakeDirResult,
    ReadResult,
    RemoveResult,
    RenameResult,
    StatResult,
    UploadResult,
    WriteResult,
)
from orchestrator.session.processes import (
    ProcessInfo,
    ProcessKillResult,
    ProcessOutputResult,
    ProcessStartResult,
)
from orchestrator.session.repl.interpreter import ExecuteOutcome, InterruptOutcome
from orchestrator.session.repl.protocol import InspectReply, VariableInfo
from orchestrator.session.shell import ShellRunResult
from orchestrator.session.terminal.models import TerminalResult, TerminalStatus

__all__ = ["RESULTS", "ResultShape"]

# A field a handler sets itself: its name, its type as the page says it, and what it means.
Added = Mapping[str, tuple[str, str]]

SESSION = {"session_id": ("string", "The session the call used.")}
CREATED = {"created_new_session": ("boolean", "Whether this call created the session.")}


@dataclass(frozen=True)
class ResultShape:
    """One operation's answer: ``added`` fields, then ``model``'s; ``items`` gives the shape of
    each item of a list field."""

    added: Added = field(default_factory=dict)
    model: type[BaseModel] | None = None
    items: Mapping[str, ResultShape] = field(default_factory=dict)


MEANINGS: Mapping[type[BaseModel], Mapping[str, str]] = {
    ExecuteOutcome: {
        "success": "Whether the code ran to its end without raising.",
        "stdout": "What the code printed, up to the policy's `output.max_stream_bytes`.",
        "stderr": "What the code wrote to stderr, within the same cap.",
        "stdout_bytes": "Bytes written to stdout, what the cap cut away included.",
        "stderr_bytes": "Bytes written to stderr, what the cap cut away included.",
        "result_repr": "The `repr()` of a final expression's value, when there is one.",
        "results": "Rich results in the order the cell showed them: MIME bundles holding "
        "`text/plain` and any of `text/html`, `text/markdown`, `image/svg+xml`, `image/png`, "
        "`image/jpeg` (base64), `text/latex`, `application/json`, "
        "`application/vnd.sandhold.data+json` (a DataFrame's columns as lists), with "
        "`is_main_result` for "
        "the final expression's value and `truncated` when a representation was left out for "
        "size. From `display()`, the final expression and matplotlib figures.",
        "error_type": "On failure: the exception's class name, or `timeout`, `validation`, "
        "`import_blocked`, `process_crashed`, `output_limit`.",
        "error_message": "On failure: the exception's message, or why the code did not run.",
        "traceback": "On an exception: the traceback, as Python prints it.",
        "violations": "With `validation` or `import_blocked`: every reason the code was refused.",
        "execution_time_ms": "Wall-clock time of the cell (measured by the worker).",
        "cpu_time_ms": "CPU time of the cell (measured by the worker).",
        "peak_memory_mb": "Peak memory of the interpreter during the cell, in MiB (the worker's).",
        "timed_out": "The cell ran past its timeout and was interrupted.",
        "state_reset": "The interpreter was replaced since the last call (a timeout SIGINT "
        "could not end, a crash): earlier variables are gone.",
        "truncated": "Some output was cut to fit the caps.",
    },
    ExecuteResult: {
        "session_id": "The session the code ran in.",
        "created_new_session": "Whether this call created the session.",
    },
    InterruptOutcome: {
        "interrupted": "Whether a cell was running and has been stopped.",
        "ran_for_s": "How long the stopped cell had run, in seconds.",
        "state_reset": "The cell did not stop within the policy's kill grace, so its "
        "interpreter was replaced: earlier variables are gone.",
    },
    InterruptResult: {
        "session_id": "The session.",
        "running": "The call whose cell was stopped (`python_repl.execute`), if one was.",
    },
    InspectReply: {
        "found": "Whether the session has a variable of that name.",
        "name": "The variable's name.",
        "type": "Its type's name.",
        "repr": "Its `repr()`, shortened when long.",
        "length": "Its `len()`, when it has one.",
        "doc": "Its docstring, when it has one.",
        "signature": "Its call signature, for a callable.",
        "shape": "Its shape, for an array or a data frame.",
        "dtype": "Its element type, for an array or a series.",
    },
    VariableInfo: {"name": "The variable's name.", "type": "Its type's name."},
    TerminalResult: {
        "terminal_id": "The terminal.",
        "state": "Whether its command still runs.",
        "exit_code": "The command's exit status, once it has exited.",
        "use_pty": "Whether it runs in a pseudo-terminal (else pipes).",
        "output": "Output after the cursor, as text.",
        "next_seq": "The cursor after this output: `since_seq` for the next read.",
        "next_offset": "The byte offset after this output: `since_offset` for the next read.",
        "gap": "Output between the cursor and this reply was dropped from the buffer.",
        "dropped_bytes": "With `gap`, bytes dropped (when the cursor was an offset).",
        "dropped_chunks": "With `gap`, chunks dropped (when the cursor was a sequence number).",
        "has_more": "More output is buffered past this reply (`max_bytes`).",
        "truncated": "The reply holds less than the buffer has (`has_more`, or `omitted_chars`).",
        "omitted_chars": "Characters left out of the middle to fit `max_output_chars`.",
        "wait_reason": "Why it returned: new output, the command's exit, or the time ran out.",
    },
    TerminalStatus: {
        "terminal_id": "The terminal.",
        "state": "Whether its command still runs.",
        "exit_code": "The command's exit status, once it has exited.",
        "use_pty": "Whether it runs in a pseudo-terminal.",
        "stdin_closed": "Whether its input is closed.",
        "written_bytes": "Bytes of input written by this call.",
        "signal": "The signal this call sent.",
        "signal_sent": "Whether it was delivered (false: the command had already exited).",
        "escalated": "Whether KILL followed because the command outlived the grace.",
    },
    ShellRunResult: {
        "stdout": "The command's output (stdout and stderr together), cut at the cap.",
        "exit_code": "The command's exit status; null when it timed out.",
        "cwd": "The shell's working directory after the command.",
        "timed_out": "The command ran past its timeout and was interrupted.",
        "shell_restarted": "The shell had to be replaced: its cwd and exports are lost.",
        "truncated": "Output was cut to fit the cap.",
    },
    ProcessStartResult: {
        "process_id": "The process, for `read_output` and `kill`.",
        "pid": "Its process id inside the container.",
        "pgid": "Its process group, which `kill` ends as a whole.",
        "command": "The command line, as given.",
        "cwd": "Its working directory.",
    },
    ProcessInfo: {
        "process_id": "The process.",
        "state": "`running`, `exited` or `killed`.",
        "exit_code": "Its exit status once ended (minus the signal number when a signal ended it).",
        "ports": "TCP ports its processes listen on.",
        "elapsed_s": "Seconds since it started.",
        "pid": "Its process id inside the container.",
        "command": "The command line.",
    },
    ProcessOutputResult: {
        "output": "The last lines of its log.",
        "lines": "How many lines `output` holds.",
        "dropped_bytes": "Output the log's size cap discarded.",
        "truncated": "Fewer lines came back than asked for because of a cap.",
    },
    ProcessKillResult: {
        "signal_used": "The strongest signal sent; null if the group had already ended.",
        "group_empty": "Whether no process of its group remains.",
    },
    WriteResult: {
        "path": "The file's path in the container.",
        "size": "Bytes written.",
        "created": "Whether the file is new.",
    },
    ReadResult: {
        "path": "The file's path in the container.",
        "size": "Its size in bytes.",
        "encoding": "`utf-8`: `content` holds it; `base64`: `content_b64` does.",
        "content": "The file as text (UTF-8 without NUL bytes).",
        "content_b64": "The file's bytes, base64-encoded (any other file).",
    },
    ListResult: {
        "path": "The directory's path in the container.",
        "entries": "Its entries.",
        "truncated": "The directory has more entries than one listing returns.",
    },
    FileEntry: {
        "name": "The entry's name.",
        "type": "What it is.",
        "size": "Its size in bytes.",
        "mode": "Permission bits, in octal (`0644`).",
        "mtime": "Last modification, in seconds since the epoch.",
        "link_target": "For a symlink, where it points.",
        "metadata": "Its `user.e2b.*` extended attributes (E2B's file metadata), if any.",
    },
    StatResult: {"path": "The entry's path in the container."},
    ExistsResult: {
        "path": "The path asked about, in the container.",
        "exists": "Whether an entry is there (a symlink counts, wherever it points).",
        "type": "What it is (`file`, `dir`, `symlink`, `other`); null when nothing is there.",
    },
    RemoveResult: {
        "path": "The path removed.",
        "type": "What it was (`file`, `dir`, `symlink`, `other`).",
    },
    RenameResult: {
        "path": "Where the entry was.",
        "new_path": "Where it is now.",
        "replaced": "Whether an entry at `new_path` was replaced (only with `overwrite`).",
    },
    MakeDirResult: {
        "path": "The directory's path in the container.",
        "created": "Whether this call made it (false: it was there already).",
    },
    UploadResult: {
        "path": "The directory the archive was extracted into.",
        "entries": "Members extracted.",
        "size": "Bytes extracted.",
    },
    DownloadResult: {
        "path": "What was archived.",
        "size": "Bytes archived.",
        "entries": "Members in the archive.",
        "tar_b64": "The tar archive, base64-encoded.",
    },
}

PAUSE = {
    "paused": ("boolean", "Whether the session is now paused."),
    "changed": ("boolean", "Whether this call changed it (false: it already was)."),
}

METADATA = {
    "metadata": ("object", "The labels given at `session create` (string to string)."),
}

REPL_FRESH = {
    "repl_state": (
        "string",
        "`fresh`: the session's REPL starts empty (a snapshot keeps files, never a REPL's memory).",
    )
}

SNAPSHOT = {
    "snapshot_id": ("string", "The snapshot's id (`session create` with `snapshot`)."),
    "policy": ("string", "The policy of the session it was taken of; its sessions get it."),
    "source_session": ("string", "The session it was taken of."),
    "created_at": ("string", "When it was taken (ISO 8601)."),
    "size_bytes": (
        "integer",
        "What it takes on the engine's disk beyond its template's image, counted against "
        "the tenant's `snapshots_mb` quota.",
    ),
    **METADATA,
    "env_names": ("array of string", "The names of the env it keeps (never the values)."),
    "keeps": (
        "array of string",
        "What a session made from it gets: `filesystem`, `policy`, `metadata`, `env`.",
    ),
    **REPL_FRESH,
}

NETWORK_DENIED = {
    "network_denied": (
        "array of object",
        "Only when the session's egress proxy refused an attempt during the call: `host`, "
        "`port` and `rule` of each (see `session.network_log`).",
    ),
}

CONTEXT_FIELDS = {
    "id": ("string", "The context's id (`default`: the session's own REPL)."),
    "language": ("string", "`python`, `bash`, `javascript`, `typescript`, `r` or `java`."),
    "cwd": ("string or null", "Its working directory; null: the session's."),
}
CONTEXT = {"context": ("object", "The context: `id`, `language`, `cwd`.")}

RESULTS: Mapping[str, ResultShape] = {
    "python_repl.execute": ResultShape(NETWORK_DENIED, ExecuteResult),
    "python_repl.reset": ResultShape(SESSION),
    "python_repl.destroy": ResultShape(
        {**SESSION, "destroyed": ("boolean", "Whether a session was ended by this call.")}
    ),
    "python_repl.list_sessions": ResultShape(
        {
            "sessions": ("array of session", "Your sessions."),
            "count": ("integer", "How many."),
        },
        items={
            "sessions": ResultShape(
                {
                    "session_id": ("string", "The session."),
                    "policy": ("string", "The policy it runs under."),
                    "task": ("string or null", "The task that owns it, if any."),
                    "created_at": ("string", "When it was created (ISO 8601)."),
                    "idle_seconds": ("number", "Seconds since its last call."),
                    "commands_count": ("integer", "Cells in its history."),
                    **METADATA,
                }
            )
        },
    ),
    "python_repl.history": ResultShape(
        {
            **SESSION,
            "history": ("array of entry", "The cells run, oldest first."),
            "count": ("integer", "How many."),
        },
        items={
            "history": ResultShape(
                {
                    "index": ("integer", "The cell's number in the session."),
                    "code": ("string", "The code."),
                    "timestamp": ("string", "When it ran (ISO 8601)."),
                    "success": ("boolean", "Whether it ran without raising."),
                    "outcome": (
                        "string",
                        "`ok`, `error`, or `cancelled`: stopped before its end by its caller's "
                        "cancel or by `interrupt` (what it did until then is kept).",
                    ),
                    "summary": ("string", "One line: the start of its output, or its outcome."),
                }
            )
        },
    ),
    "python_repl.interrupt": ResultShape(model=InterruptResult),
    "python_repl.history_context": ResultShape(
        {**SESSION, "context": ("string", "The history as Markdown, within `max_tokens`.")}
    ),
    "python_repl.inspect": ResultShape(SESSION, InspectReply),
    "python_repl.list_variables": ResultShape(
        {
            **SESSION,
            "variables": ("array of variable", "The session's variables."),
            "modules": ("array of string", "Modules the session has imported."),
            "count": ("integer", "How many variables."),
        },
        items={"variables": ResultShape(model=VariableInfo)},
    ),
    "python_repl.create_context": ResultShape({**SESSION, **CONTEXT}),
    "python_repl.list_contexts": ResultShape(
        {
            **SESSION,
            "contexts": ("array of context", "The session's contexts, `default` first."),
            "count": ("integer", "How many."),
        },
        items={"contexts": ResultShape(CONTEXT_FIELDS)},
    ),
    "python_repl.restart_context": ResultShape({**SESSION, **CONTEXT}),
    "python_repl.remove_context": ResultShape(
        {**SESSION, **CONTEXT, "removed": ("boolean", "True: the context has ended.")}
    ),
    "terminal.start": ResultShape({**SESSION, **CREATED}, TerminalResult),
    "terminal.read": ResultShape(SESSION, TerminalResult),
    "terminal.wait": ResultShape(SESSION, TerminalResult),
    "terminal.write": ResultShape(SESSION, TerminalStatus),
    "terminal.interrupt": ResultShape(SESSION, TerminalStatus),
    "terminal.kill": ResultShape(SESSION, TerminalStatus),
    "terminal.resize": ResultShape(SESSION, TerminalStatus),
    "terminal.run": ResultShape({**SESSION, **CREATED, **NETWORK_DENIED}, ShellRunResult),
    "process.start": ResultShape(SESSION, ProcessStartResult),
    "process.list": ResultShape(
        {
            "processes": ("array of process", "Background processes, of every session asked."),
            "count": ("integer", "How many."),
        },
        items={"processes": ResultShape(SESSION, ProcessInfo)},
    ),
    "process.read_output": ResultShape(SESSION, ProcessOutputResult),
    "process.kill": ResultShape(SESSION, ProcessKillResult),
    "files.write": ResultShape(SESSION, WriteResult),
    "files.read": ResultShape(SESSION, ReadResult),
    "files.list": ResultShape(SESSION, ListResult, {"entries": ResultShape(model=FileEntry)}),
    "files.stat": ResultShape(SESSION, StatResult),
    "files.exists": ResultShape(SESSION, ExistsResult),
    "files.remove": ResultShape(SESSION, RemoveResult),
    "files.rename": ResultShape(SESSION, RenameResult),
    "files.make_dir": ResultShape(SESSION, MakeDirResult),
    "files.upload": ResultShape(SESSION, UploadResult),
    "files.download": ResultShape(SESSION, DownloadResult),
    "session.create": ResultShape(
        {
            "session_id": ("string", "The new session."),
            **CREATED,
            "policy": ("string", "The policy the session runs under."),
            **METADATA,
            "snapshot_id": ("string or null", "The snapshot it was made from, if any."),
            **REPL_FRESH,
        }
    ),
    "session.snapshot": ResultShape({**SESSION, **SNAPSHOT}),
    "session.fork": ResultShape(
        {
            "session_id": ("string", "The new session, a copy of the source's files."),
            "source_session": ("string", "The session copied."),
            **CREATED,
            "policy": ("string", "The policy the session runs under (the source's)."),
            **METADATA,
            **REPL_FRESH,
        }
    ),
    "session.snapshots": ResultShape(
        {"snapshots": ("array of object", "Your snapshots, oldest first.")},
        items={"snapshots": ResultShape(SNAPSHOT)},
    ),
    "session.delete_snapshot": ResultShape(
        {
            "snapshot_id": ("string", "The snapshot deleted."),
            "deleted": ("boolean", "Always true: its id is unknown from now on."),
            "image_removed": (
                "boolean",
                "Whether its image is gone already; false while a session made from it runs "
                "(the image goes at the first sweep after that session ends).",
            ),
        }
    ),
    "session.network_log": ResultShape(
        {
            **SESSION,
            "entries": (
                "array of object",
                "Egress attempts, oldest first (at most 512): `seq`, `time` (Unix seconds), "
                "`method` (`CONNECT` or the HTTP method), `host`, `port`, `decision` (`allow` "
                "or `deny`), `rule` (the allow entry that matched, `open`, or why it was "
                "refused: `allowlist`, `private_address`, `sni_mismatch`, `sni_missing`, "
                "`not_tls`, `auth`, `dns`, `limit.connections`, `limit.bytes`, "
                "`bad_request`), `bytes_sent`, `bytes_received`, `duration_s`. Empty when the "
                "policy's network mode is `none`.",
            ),
            "denied": ("integer", "How many of the entries were refused."),
        }
    ),
    "session.set_timeout": ResultShape(
        {
            **SESSION,
            "timeout_s": ("number", "Seconds from this call until the session ends."),
            "ends_at": ("string", "When it ends (ISO 8601); the reaper's next round ends it."),
            "max_timeout_s": (
                "number",
                "The most `timeout_s` could have been at this call: what the policy's "
                "`timeouts.max_lifetime_s` leaves of the session's lifetime.",
            ),
        }
    ),
    "session.metrics": ResultShape(
        {
            **SESSION,
            "cpu_seconds": ("number", "CPU time the container used since it started."),
            "cpu_percent": (
                "number or null",
                "CPU use since this session's previous `metrics`, in percent of one CPU (200: "
                "two busy); null on the first.",
            ),
            "memory_bytes": ("integer", "Memory the container uses now, as the engine counts."),
            "memory_limit_bytes": ("integer", "The container's memory limit."),
            "pids": ("integer", "Processes and threads in the container."),
            "sampled_at": ("string", "When the engine was asked (ISO 8601)."),
        }
    ),
    "session.set_allowlist": ResultShape(
        {**SESSION, "allow": ("array of string", "The rules now in force, duplicates dropped.")}
    ),
    "session.pause": ResultShape({**SESSION, **PAUSE}),
    "session.resume": ResultShape({**SESSION, **PAUSE}),
    "session.share": ResultShape(
        {
            "terminal_id": ("string", "The terminal shared."),
            "task": ("string", "The task that received the grant."),
            "actions": ("array of string", "The actions granted, sorted."),
        }
    ),
    "session.close_owner": ResultShape(
        {
            "task": ("string", "The task closed."),
            "sessions_ended": ("integer", "Sessions this call ended."),
            "converged": (
                "boolean",
                "Whether nothing of the task is left (no session, none starting).",
            ),
        }
    ),
}
