"""What the ``env`` arguments mean, worded once for every tool that takes one: a session's env
(given when it is made) and one command's (over the session's, for that command only). The
rules they are checked by are ``policy.env``'s."""

from __future__ import annotations

__all__ = ["CALL_ENV", "SESSION_ENV", "SESSION_ENV_ON_CREATE"]

_RULES = (
    "Names are [A-Za-z_][A-Za-z0-9_]*; the policy refuses some (LD_*, PATH, PYTHON*...: "
    "error_type policy); values are strings without NUL."
)
SESSION_ENV = (
    "Environment variables of the new session: every process in it sees them (the REPL, the "
    f"shell, terminals, background processes). {_RULES}"
)
SESSION_ENV_ON_CREATE = (
    "Environment variables of a new session (only without session_id): every process in it "
    f"sees them (the REPL, the shell, terminals, background processes). {_RULES}"
)
CALL_ENV = f"Environment variables for this command only, over the session's env. {_RULES}"
