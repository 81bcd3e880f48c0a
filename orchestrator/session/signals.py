"""Signals to process groups inside a session container, and the names callers may give them.

The container has its own pid namespace, so nothing on the host can name a process in it. A signal
is therefore a short exec of bash's ``kill -s SIG -- -PGID`` as the sandbox user, argv only: the
caller's signal name is checked against the host's signal table first, never passed on as given.
Docker makes every exec's process a session and process-group leader, so the pid an exec reports
for itself is the pgid of everything it starts (unless a child moves out with setsid).
"""

from __future__ import annotations

import contextlib
import signal as signals

import anyio

from orchestrator.backend.base import Backend, ExecSpec
from orchestrator.errors import InvalidArgumentError, OrchestratorError

__all__ = ["signal_name", "signal_process_group", "signal_process_group_quietly"]

# A short exec of ``kill``; the engine answers in ~60 ms.
SIGNAL_TIMEOUT = 10.0
# ``kill`` prints at most a line of complaint.
MAX_KILL_OUTPUT_BYTES = 4096


async def signal_process_group(backend: Backend, container_id: str, pgid: int, name: str) -> bool:
    """Send signal ``name`` to process group ``pgid`` inside the container, as the sandbox user.
    True when ``kill`` found the group."""
    argv = ["bash", "-c", 'kill -s "$1" -- "-$2"', "sandhold-signal", name, str(pgid)]
    result = await backend.run(
        container_id,
        ExecSpec(argv=argv),
        timeout=SIGNAL_TIMEOUT,
        max_output_bytes=MAX_KILL_OUTPUT_BYTES,
    )
    return result.exit_code == 0


async def signal_process_group_quietly(
    backend: Backend, container_id: str, pgid: int, name: str
) -> None:
    """``signal_process_group`` for teardown: bounded, and an engine error is not raised."""
    with contextlib.suppress(OrchestratorError), anyio.move_on_after(SIGNAL_TIMEOUT):
        await signal_process_group(backend, container_id, pgid, name)


def signal_name(value: object) -> str:
    """The canonical name (``TERM``) of a signal given by name (``TERM``, ``sigterm``) or
    number (15). Anything else, a misspelling included, is refused, never guessed."""
    sig: signals.Signals | None = None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            sig = signals.Signals(value)
    elif isinstance(value, str):
        name = value.strip().upper()
        sig = signals.Signals.__members__.get(name if name.startswith("SIG") else f"SIG{name}")
    if sig is None:
        raise InvalidArgumentError(
            f"signal {str(value)[:32]!r} is not a known signal name or number"
        )
    return sig.name.removeprefix("SIG")
