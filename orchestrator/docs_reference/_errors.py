"""The error types section of the tool reference: every ``error_type`` of ``ERROR_TYPES`` and
of the HTTP front, what it means, whether the call itself failed, and its REST status."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.docs_reference._markdown import table
from orchestrator.errors import ERROR_TYPES
from orchestrator.http import RATE_LIMITED, STATUS_BY_ERROR_TYPE
from orchestrator.tools import CALL_FAILURES

__all__ = ["errors_section"]

# Types only the HTTP front answers: the request never reached a tool.
HTTP_ONLY: Mapping[str, int] = {"unauthenticated": 401, RATE_LIMITED: 429}

MEANINGS: Mapping[str, str] = {
    "invalid_argument": "An argument, a request body or a setting is malformed, out of bounds "
    "or unknown; nothing ran.",
    "session_not_found": "No session, terminal, process or task of that id is yours: unknown "
    "ids and other owners' ids get the same answer.",
    "session_lost": "Your session ended without being asked to: its container stopped or "
    "vanished (the engine restarted, it was killed from outside, it could not be re-adopted "
    "after a restart); `cause` says which. Start a new session.",
    "validation": "The code was refused before it ran (a forbidden builtin or construct of the "
    "restricted mode); `violations` lists every reason.",
    "import_blocked": "The code imports a module the policy does not allow; the cell did not "
    "run past that import.",
    "timeout": "The work ran past its timeout and was interrupted; `timed_out` and "
    "`state_reset` say what was kept.",
    "process_crashed": "The process serving the call died (an exit, a signal, out of memory); "
    "the session's next call gets a fresh one.",
    "output_limit": "The output was past a limit truncation could not meet.",
    "quota_exceeded": "Granting the call would pass a quota of the tenant, the policy or the "
    "server; `quota` names it.",
    "policy": "The policy in force forbids the call (a command, a disabled shell, a policy the "
    "tenant may not use, a closed task); `rule` names the rule.",
    "busy": "The session is serving another call, and this one waited as long as it may (or "
    "the operation does not wait, as `pause` does not).",
    "backend_unavailable": "The container engine cannot be reached, or lacks what the policy "
    "needs (a runtime).",
    "unknown_template": "The policy (the message names its file and key) or the request names an "
    "image template that is neither shipped nor in the template directories.",
    "template_not_built": "The policy's template has no image, and this backend builds none: "
    "build it (`sandhold image build --template NAME`) or configure its image.",
    "not_supported": "The backend in use cannot do this at all (snapshots on Kubernetes); the "
    "message names the operation and the backend. Nothing was made.",
    "path_not_found": "No file or directory at that path in the session (the session exists).",
    "storage_full": "sandhold's own data directory (its registry, its audit log) has no room "
    "left, or its disk fails: the message names the file. Nothing was made; free space there "
    "and call again.",
    "internal": "A fault of sandhold itself; the message says no more, the server's log does.",
    "unauthenticated": "HTTP only: no API key, or not a valid one.",
    RATE_LIMITED: "HTTP only: too many wrong keys from this address, or too many connections "
    "from it; `Retry-After` says when to try again.",
}


def _rows() -> list[list[str]]:
    missing = (set(ERROR_TYPES) | set(HTTP_ONLY)) ^ set(MEANINGS)
    if missing:
        raise ValueError(f"error types without a meaning, or meanings of none: {sorted(missing)}")
    rows = []
    for name in [*ERROR_TYPES, *HTTP_ONLY]:
        failed = name in CALL_FAILURES or name in HTTP_ONLY
        kind = "the call failed" if failed else "the call completed"
        status = HTTP_ONLY.get(name) or STATUS_BY_ERROR_TYPE.get(name, 200)
        rows.append([f"`{name}`", MEANINGS[name], kind, str(status)])
    return rows


def errors_section() -> str:
    return "\n\n".join(
        [
            "## Error types",
            "A result with `success: false` carries one `error_type` (stable) and an "
            '`error_message` (for people, may change). "The call failed" is MCP\'s `isError: '
            'true` and a REST status other than 200; "the call completed" is an answer about '
            "the work, with `isError: false` and 200 (see [the tool contract]"
            "(../tool-contract.md)).",
            table(["`error_type`", "meaning", "kind", "REST status"], _rows()),
            "An exception the user's code raised is reported under its class name "
            "(`ZeroDivisionError`, `KeyError`), a completed call; a worker-side name that would "
            "pose as one of the types above is qualified so that it cannot. The audit log also "
            "records `cancelled` for a call whose caller went away before its answer.",
        ]
    )
