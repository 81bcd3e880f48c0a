"""What the ``env`` arguments mean, worded once for every tool that takes one: a session's env
(given when it is made) and one command's (over the session's, for that command only). The
rules they are checked by are ``policy.env``'s."""

from __future__ import annotations

__all__ = ["CALL_ENV", "CELL_ENV", "SESSION_ENV", "SESSION_ENV_ON_CREATE"]

_REFUSED = "some names (LD_*, PATH, PYTHON*...) are refused (error_type policy)."
SESSION_ENV = (
    "Environment variables every process of the new session sees (the REPL, the shell, "
    f"terminals, background processes); {_REFUSED}"
)
SESSION_ENV_ON_CREATE = (
    "Environment variables of a new session (only without session_id), seen by every process "
    f"in it; {_REFUSED}"
)
CELL_ENV = (
    "Environment variables for this cell only (and the processes it starts), over the "
    f"session's; {_REFUSED}"
)
CALL_ENV = f"Environment variables for this command only, over the session's; {_REFUSED}"
