"""A session's REPL contexts beside its default one: each its own worker process (its own state,
cwd and language), made, listed, restarted and removed on request.

The default context is the session's ``repl`` (the Python REPL every session has); these are
the others. A context of another language runs a kernel (``worker/kernel_*.py``) that speaks
the worker's protocol, so every context has the default one's guarantees: a timeout interrupts
with the state kept or replaces the worker with ``state_reset``, a worker that dies is replaced
on the next call and says so, each keeps its history. A context named after a language
(``bash``) is that language's own default, made on its first use.

Invariants: the caller holds the session's turn for every change and every cell (so contexts of
one session run one cell at a time); at most ``MAX_CONTEXTS`` exist at once; a restricted
policy has Python contexts only (its rules are Python's); contexts do not persist across an
orchestrator restart (their workers end with their streams), unlike the default one.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel, ConfigDict

from orchestrator.backend.base import Backend
from orchestrator.errors import (
    InvalidArgumentError,
    PolicyViolationError,
    ProcessCrashedError,
    QuotaExceededError,
)
from orchestrator.policy.model import Policy
from orchestrator.session.history import CodeHistory
from orchestrator.session.repl.interpreter import IDLE_PROBE_AFTER, Repl
from orchestrator.session.repl.worker_process import WORKER_ARGV

__all__ = [
    "DEFAULT_CONTEXT",
    "LANGUAGES",
    "MAX_CONTEXTS",
    "ContextInfo",
    "ReplContext",
    "ReplContexts",
    "canonical_language",
    "is_default",
    "language_named",
]

DEFAULT_CONTEXT: Final = "default"
# Each context is a process in the session's memory and pids limits (a Python worker ~15 MiB,
# bash ~5 MiB); eight beside the default one cover an agent's languages and scratch contexts.
MAX_CONTEXTS: Final = 8
# Context ids: 64 random bits, unique within a session (they are never a session's secret).
CONTEXT_ID_BYTES: Final = 8
MAX_CWD_CHARS: Final = 4096
# The worker starts in the context's cwd: this shell changes to it, then execs the worker
# (same pid, so the pid the worker's launcher announced stays true).
CWD_LAUNCHER: Final = ("/bin/sh", "-c", 'cd -- "$1" || exit 97; shift; exec "$@"', "sandhold-cwd")
KERNEL_DIR: Final = "/opt/sandhold/worker"
# Each language's worker, by its canonical name.
LANGUAGES: Final[Mapping[str, tuple[str, ...]]] = {
    "python": WORKER_ARGV,
    "bash": ("python3", "-I", f"{KERNEL_DIR}/kernel_bash.py"),
    # Needs node in the session's image: a template with Debian's nodejs.
    "javascript": ("python3", "-I", f"{KERNEL_DIR}/kernel_node.py"),
    # node and Debian's node-typescript (code-interpreter); R and a JDK (code-interpreter-full).
    "typescript": ("python3", "-I", f"{KERNEL_DIR}/kernel_typescript.py"),
    "r": ("python3", "-I", f"{KERNEL_DIR}/kernel_r.py"),
    "java": ("python3", "-I", f"{KERNEL_DIR}/kernel_java.py"),
}
ALIASES: Final[Mapping[str, str]] = {
    "py": "python",
    "python3": "python",
    "sh": "bash",
    "shell": "bash",
    "js": "javascript",
    "node": "javascript",
    "ts": "typescript",
    "jshell": "java",
}


def canonical_language(name: object) -> str:
    """The language ``name`` names (``py`` is ``python``), or ``invalid_argument``."""
    if isinstance(name, str):
        lowered = name.strip().lower()
        lowered = ALIASES.get(lowered, lowered)
        if lowered in LANGUAGES:
            return lowered
    shown = repr(name)[:64]
    raise InvalidArgumentError(
        f"unknown language {shown}; supported: {', '.join(LANGUAGES)}",
    )


def is_default(context: object) -> bool:
    """Whether ``context`` names the session's default REPL: none, ``default`` or Python's
    name (the default context is Python's own)."""
    return context is None or context == DEFAULT_CONTEXT or language_named(context) == "python"


def language_named(context: object) -> str | None:
    """The language whose own context ``context`` names (``bash``, ``sh``), if it is one."""
    if not isinstance(context, str):
        return None
    lowered = context.strip().lower()
    lowered = ALIASES.get(lowered, lowered)
    return lowered if lowered in LANGUAGES else None


class ContextInfo(BaseModel):
    """A context as callers see it; ``cwd`` None: the session's working directory."""

    model_config = ConfigDict(frozen=True)

    id: str
    language: str
    cwd: str | None = None


@dataclass(eq=False)
class ReplContext:
    info: ContextInfo
    repl: Repl
    history: CodeHistory


class ReplContexts:
    """The contexts of one session besides its default REPL."""

    def __init__(self, backend: Backend, container_id: str, policy: Policy) -> None:
        self._backend = backend
        self._container_id = container_id
        self._policy = policy
        self._contexts: dict[str, ReplContext] = {}

    def list(self) -> list[ContextInfo]:
        return [context.info for context in self._contexts.values()]

    def get(self, context_id: object) -> ReplContext:
        """The context ``context_id`` (not the default one), or ``invalid_argument``."""
        found = self._contexts.get(context_id) if isinstance(context_id, str) else None
        if found is None:
            raise InvalidArgumentError(
                f"no context {repr(context_id)[:80]} in this session, and no language of that "
                f"name (languages: {', '.join(LANGUAGES)})",
                hint="list_contexts shows the session's contexts",
            )
        return found

    async def create(
        self,
        language: object,
        cwd: object = None,
        *,
        env: Mapping[str, str],
        context_id: str | None = None,
    ) -> ContextInfo:
        """A new context of ``language`` in ``cwd``, its worker started (so a cwd that does not
        exist is refused now, not at the first cell); ``env`` is the session's."""
        name = canonical_language(language)
        if name != "python" and self._policy.python.mode == "restricted":
            raise PolicyViolationError(
                f"the policy's REPL is restricted, which only Python contexts can be: {name} "
                "contexts need an unrestricted policy",
                rule="python.mode",
            )
        directory = _checked_cwd(cwd)
        if len(self._contexts) >= MAX_CONTEXTS:
            raise QuotaExceededError(
                f"contexts: a session holds at most {MAX_CONTEXTS} contexts beside its default",
                quota="contexts",
                hint="remove_context ends one",
            )
        argv = LANGUAGES[name]
        if directory is not None:
            argv = (*CWD_LAUNCHER, directory, *argv)
        # A kernel ends itself when its language's process does (``exit`` in bash): looked at
        # before every cell, so the cell after an ``exit`` runs in a fresh one.
        repl = Repl(
            self._backend,
            self._container_id,
            self._policy,
            worker_argv=argv,
            persist=False,
            probe_after=IDLE_PROBE_AFTER if name == "python" else 0.0,
        )
        await repl.set_env(env)
        try:
            await repl.start()
        except ProcessCrashedError as exc:
            if directory is not None:
                raise InvalidArgumentError(
                    f"the context could not start in {directory!r} (does it exist?): {exc}"
                ) from exc
            if name != "python":
                raise InvalidArgumentError(
                    f"the {name} kernel could not start: {exc}",
                    hint=f"{name} needs its runtime in the session's template",
                ) from exc
            raise
        info = ContextInfo(
            id=context_id or secrets.token_hex(CONTEXT_ID_BYTES), language=name, cwd=directory
        )
        self._contexts[info.id] = ReplContext(
            info, repl, CodeHistory(self._policy.python.max_history)
        )
        return info

    async def for_language(self, language: str, *, env: Mapping[str, str]) -> ReplContext:
        """The language's own default context (its id is the language's name), made on first use."""
        name = canonical_language(language)
        if name not in self._contexts:
            await self.create(name, env=env, context_id=name)
        return self._contexts[name]

    async def restart(self, context_id: object) -> ContextInfo:
        context = self.get(context_id)
        await context.repl.reset()
        context.history.clear()
        return context.info

    async def remove(self, context_id: object) -> ContextInfo:
        context = self.get(context_id)
        del self._contexts[context.info.id]
        await context.repl.aclose()
        return context.info

    async def set_env(self, env: Mapping[str, str]) -> None:
        for context in self._contexts.values():
            await context.repl.set_env(env)

    async def aclose(self) -> None:
        """End every context's worker (each is let go of even if an earlier one failed)."""
        contexts, self._contexts = list(self._contexts.values()), {}
        for context in contexts:
            await context.repl.aclose()


def _checked_cwd(cwd: object) -> str | None:
    if cwd is None:
        return None
    if (
        not isinstance(cwd, str)
        or not cwd.startswith("/")
        or "\0" in cwd
        or len(cwd) > MAX_CWD_CHARS
    ):
        raise InvalidArgumentError(
            f"cwd must be an absolute path of at most {MAX_CWD_CHARS} characters, "
            f"got {repr(cwd)[:80]}"
        )
    return cwd
