"""Re-adopting one session a crashed orchestrator left running: its container is there, its
registry row says who owns it, under which policy, and which pid its REPL worker has.

Steps, each bounded: thaw the container if it was paused; sweep the orphans the old orchestrator
left (``worker/sweep.py``: its terminals and shell, whose streams nobody reads any more); reach
the worker through a relay (its state intact) or, failing that, start a fresh one (the next
execute says ``state_reset``); give the session its env again; restore the code history. Any
failure is raised: the caller reaps.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import anyio.abc

from orchestrator._core.session_table import restore_settings
from orchestrator.backend.base import Backend, ContainerSummary, ExecSpec
from orchestrator.errors import BackendError
from orchestrator.policy.model import Policy
from orchestrator.registry.store import Registry, SessionRecord
from orchestrator.session.session import Session

log = logging.getLogger(__name__)

SWEEP_ARGV = ("python3", "-I", "/opt/sandhold/worker/sweep.py")
SWEEP_TIMEOUT = 15.0
TERMINAL = "terminal"


async def adopt_session(
    backend: Backend,
    store: Registry,
    record: SessionRecord,
    container: ContainerSummary,
    *,
    task_group: anyio.abc.TaskGroup,
    on_new_worker: Callable[[int], None],
) -> tuple[Session, list[tuple[str, str]]]:
    """The session object for ``record``, ready for work, and the ids made inside it that still
    mean something (background processes; terminals died with the sweep)."""
    policy = Policy.model_validate_json(record.policy_json)
    if container.state == "paused":
        await backend.unpause(container.id)
    killed = await sweep(backend, container.id, record.worker_pid or 0)
    session = Session.assemble(
        backend,
        session_id=record.id,
        tenant=record.tenant,
        policy=policy,
        container_id=container.id,
        adopt_pid=record.worker_pid,
        on_new_worker=on_new_worker,
    )
    session.task = record.task
    restore_settings(session, record.settings)
    try:
        await session.repl.start()
        await session.set_env(record.env)
        await task_group.start(session.terminals.serve)
    except BaseException:
        await session.close_parts()
        raise
    session.history.restore(store.history(record.id, policy.python.max_history))
    store.remove_items(record.id, TERMINAL)
    items = [(k, i) for k, i in store.items(record.id) if k != TERMINAL]
    log.info(
        "session %s of %s re-adopted (%d orphaned process(es) killed)",
        record.id,
        record.tenant,
        killed,
    )
    return session, items


async def sweep(backend: Backend, container_id: str, worker_pid: int) -> int:
    """Kill what no one can reach any more; returns how many processes that was."""
    result = await backend.run(
        container_id,
        ExecSpec(argv=[*SWEEP_ARGV, str(worker_pid)]),
        timeout=SWEEP_TIMEOUT,
        max_output_bytes=4096,
    )
    try:
        killed = json.loads(result.stdout)["killed"]
    except (ValueError, KeyError, TypeError):
        raise BackendError(f"the orphan sweep failed: {result.stderr[-300:]!r}") from None
    if not isinstance(killed, int):
        raise BackendError("the orphan sweep answered nonsense")
    return killed
