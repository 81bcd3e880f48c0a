"""A running session's own settings and figures, for the ``session`` tool: the metadata it was
given at creation, a lifetime changed while it runs (``set_timeout``), and its container's CPU
and memory now (``metrics``).

A session's lifetime never passes its policy's ``timeouts.max_lifetime_s`` from its start: the
policy is the operator's bound on what a session may cost, so ``set_timeout`` moves the end
anywhere between now and that bound (sooner, or back later again), never past it. The reaper
ends a session at its first round after the end (``lifecycle.expiry_reason``), its idle timeout
still applying on the way; or, when its end action is ``pause`` (E2B's auto-pause), pauses it and
clears its end (``Pausing.pause_at_lifetime_end``): a paused session's clock is stopped, and the
thaw that resumes it gives it its last lifetime again (``renew_lifetime``), within the same bound.

Metadata, a changed end and its end action are written through to the registry (the manager
calls ``SessionTable.save_settings``), so a session re-adopted after a restart keeps them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, get_args

from orchestrator.backend.base import Backend
from orchestrator.errors import InvalidArgumentError, PolicyViolationError
from orchestrator.session.session import LifetimeEndAction, Session

__all__ = [
    "MAX_METADATA_KEYS",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_VALUE_BYTES",
    "check_metadata",
    "lifetime_end",
    "renew_lifetime",
    "session_metrics",
    "set_lifetime",
]

# Labels for finding a session again, not storage: small enough to list with every session.
MAX_METADATA_KEYS: Final = 32
MAX_METADATA_KEY_CHARS: Final = 256
MAX_METADATA_VALUE_BYTES: Final = 1024


def check_metadata(value: Any) -> dict[str, str]:
    """``value`` as a session's metadata (None: none), or invalid_argument saying why."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError("metadata must map strings to strings")
    if len(value) > MAX_METADATA_KEYS:
        raise InvalidArgumentError(f"metadata has more than {MAX_METADATA_KEYS} keys")
    checked: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_METADATA_KEY_CHARS:
            raise InvalidArgumentError(
                f"each metadata key must be a string of 1 to {MAX_METADATA_KEY_CHARS} characters"
            )
        if not isinstance(item, str):
            raise InvalidArgumentError(f"metadata value of {key!r} must be a string")
        try:
            size = len(item.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"metadata value of {key!r} is not valid text") from None
        if size > MAX_METADATA_VALUE_BYTES:
            raise InvalidArgumentError(
                f"metadata value of {key!r} is {size} bytes, more than {MAX_METADATA_VALUE_BYTES}"
            )
        checked[key] = item
    return checked


def lifetime_end(session: Session) -> float:
    """When the session ends (monotonic clock): a ``set_timeout``'s end, else its policy's."""
    if session.ends_at is not None:
        return session.ends_at
    return session.started + session.policy.timeouts.max_lifetime_s


def set_lifetime(
    session: Session,
    timeout_s: Any,
    now: float | None = None,
    *,
    end_action: Any = None,
) -> dict[str, Any]:
    """End ``session`` ``timeout_s`` seconds from now; refused (``policy``) past its policy's
    maximum lifetime. ``end_action`` says what its end does: ``"end"`` it (the default), or
    ``"pause"`` it until it is resumed; None keeps the one it has. The answer says when it
    ends and the most a later call could give."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise InvalidArgumentError("timeout_s must be a number of seconds")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise InvalidArgumentError("timeout_s must be more than 0 seconds")
    if end_action is not None and end_action not in get_args(LifetimeEndAction):
        raise InvalidArgumentError(f"end_action must be one of {list(get_args(LifetimeEndAction))}")
    now = time.monotonic() if now is None else now
    limit = session.policy.timeouts.max_lifetime_s
    most = max(0.0, session.started + limit - now)
    if timeout_s > most:
        raise PolicyViolationError(
            f"timeout_s {timeout_s:g} passes the policy's maximum lifetime of {limit:g} s: "
            f"this session may run {most:.0f} s more at most",
            rule="timeouts.max_lifetime_s",
        )
    session.ends_at = now + float(timeout_s)
    session.lifetime_s = float(timeout_s)
    if end_action is not None:
        session.lifetime_end_action = end_action
    ends = datetime.now(UTC) + timedelta(seconds=float(timeout_s))
    return {
        "timeout_s": float(timeout_s),
        "ends_at": ends.isoformat(),
        "max_timeout_s": round(most, 3),
    }


def renew_lifetime(session: Session, now: float | None = None) -> bool:
    """A session resumed after its end paused it gets its last lifetime again, from now (never
    past its policy's maximum lifetime); any other session's end stays as it is. Whether its
    end changed."""
    if session.lifetime_end_action != "pause" or session.ends_at is not None:
        return False
    if session.lifetime_s is None:
        return False
    now = time.monotonic() if now is None else now
    bound = session.started + session.policy.timeouts.max_lifetime_s
    session.ends_at = min(now + session.lifetime_s, bound)
    return True


async def session_metrics(backend: Backend, session: Session) -> dict[str, Any]:
    """The container's CPU and memory now: one stats request to the engine (about a second on
    Docker 20.10). ``cpu_percent`` is the rate since this session's previous ``metrics`` (None
    on the first), in percent of one CPU; ``cpu_seconds`` is the CPU time since it started."""
    stats = await backend.stats(session.container_id)
    at = time.monotonic()
    cpu_seconds = float(stats.get("cpu_seconds", 0.0))
    before, session.cpu_sample = session.cpu_sample, (cpu_seconds, at)
    cpu_percent = None
    if before is not None and at > before[1] and cpu_seconds >= before[0]:
        cpu_percent = round((cpu_seconds - before[0]) / (at - before[1]) * 100, 1)
    return {
        "cpu_seconds": round(cpu_seconds, 3),
        "cpu_percent": cpu_percent,
        "memory_bytes": int(stats.get("memory_bytes", 0)),
        "memory_limit_bytes": int(stats.get("memory_limit_bytes", 0)),
        "pids": int(stats.get("pids", 0)),
        "sampled_at": datetime.now(UTC).isoformat(),
    }
