"""The sweep: what an orchestrator runs in a session container it re-adopts after a crash.

Started as ``python3 -I /opt/sandhold/worker/sweep.py WORKER_PID``. The orchestrator that died left
the processes of its terminals and persistent shell behind, attached to streams nobody reads; no
one can reach them again, so they are orphans. Every exec is its own session (setsid), so the
sweep keeps whole sessions and SIGKILLs every other process:

- the session of pid 1 (docker-init and the container's idle main process);
- the session of the REPL worker being re-adopted, which holds anything its code started;
- the sessions of the background processes that ``procs.py`` records (they outlive any
  orchestrator by design, and ``process list`` still shows them);
- its own.

Prints one JSON line: ``{"killed": N}``.
"""

import json
import os
import signal
import sys

PROCS_STATE_DIR = "/tmp/.sandhold/procs"  # noqa: S108 (procs.py's records)


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _recorded_groups() -> list[int]:
    groups = []
    try:
        names = os.listdir(PROCS_STATE_DIR)
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(PROCS_STATE_DIR, name), encoding="utf-8") as handle:
                pgid = json.load(handle).get("pgid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(pgid, int) and not isinstance(pgid, bool) and pgid > 1:
            groups.append(pgid)
    return groups


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        sys.stderr.write("usage: sweep.py WORKER_PID\n")
        return 2
    keep = {_sid(1), _sid(int(argv[1])), os.getsid(0)}
    keep.update(_sid(pgid) for pgid in _recorded_groups())
    keep.discard(None)
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, os.getpid()):
            continue
        pid = int(entry)
        if _sid(pid) in keep:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass  # gone already, or not ours to signal
    sys.stdout.write(json.dumps({"killed": killed}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
