"""The host lease: proof, inside the container, that an orchestrator is attached.

While the REPL worker serves a host stream (the exec it was started on, or a relay connection of
an orchestrator that re-adopted it) it holds a shared ``flock`` on ``LEASE_PATH``. The
container's main process (the watchdog in ``backend/docker/_spec.py``) tries an exclusive lock
now and then: when it gets one for ``orphan_grace_s`` in a row, no orchestrator has been attached
for that long, and it ends the container. The lock dies with the worker's fd, so a worker killed
with its host still alive releases it too; the host starts a fresh one on its next call.

User code shares the uid and can release or take the lock: it can end its own session early or
keep its own orphan alive, never touch another session.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

LEASE_PATH = "/tmp/.sandhold-host-lease"  # noqa: S108 (a path inside the container)
# The watchdog holds its exclusive probe for microseconds; code that holds one longer would
# otherwise stall the ready frame, so the worker gives up after this and serves unleased.
HOLD_ATTEMPTS = 50
HOLD_RETRY_S = 0.02


class HostLease:
    """Held while a host stream is served; every failure to take it is ignored (the watchdog
    then ends the container after its grace, the safe direction for a host that is gone)."""

    def __init__(self, path: str = LEASE_PATH) -> None:
        self._path = path
        self._fd: int | None = None

    def hold(self) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError:
                return
        for _ in range(HOLD_ATTEMPTS):
            try:
                fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(HOLD_RETRY_S)
            except OSError:
                return

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
