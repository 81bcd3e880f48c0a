"""Background processes of a session, run inside its container (stdlib + psutil).

Called as ``python3 -I /opt/sandhold/worker/procs.py <op>`` with one JSON request on stdin; prints
one JSON reply on stdout: ``{"ok": true, ...}`` or ``{"ok": false, "error_type", "error_message"}``.
Ops: ``start``, ``list``, ``read_output``, ``kill``.

One background process is laid out as::

    this exec --fork--> A: setsid() --fork--> S: supervisor (A exits: S is docker-init's child)
                                              \\--fork--> B: setpgid(0, 0); exec bash -c COMMAND

Invariants:
- "The process" is B's process group (pgid == B's pid): it is running while any member lives,
  also after the shell itself exited and left children behind (they are re-parented to init but
  keep the group). A process that leaves the group (setsid, daemonising) is out of reach.
- S stays outside that group, so killing the group never kills the one that records how it ended:
  S reaps B and writes B's exit status (``exit_code``: the shell's status, minus the signal number
  when a signal ended it), then waits for the group to empty and writes ``ended_at``.
- B runs the command only after the registry record exists (it waits for a go byte from the
  ``start`` exec), so every process that runs is registered before its first instruction.
- The log is capped: when it would pass ``max_log_bytes``, S rewrites it as a marker line naming
  the bytes dropped so far plus the newest half of the cap, so it never exceeds the cap and
  always holds the newest output. A full disk costs output, never the command (S keeps draining).
- No signal goes to a group whose identity is not proven: the leader's pid must still carry the
  recorded create_time, or, with the leader reaped, the pgid must still have members (the kernel
  does not hand out a pid while a group of that number exists).
- Records change only under one flock, each written whole through a rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import psutil

STATE_DIR = "/tmp/.sandhold/procs"  # noqa: S108 (a tmpfs private to the container)
WORKSPACE = "/workspace"
BASH = "/bin/bash"
PROCESS_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_REQUEST_BYTES = 4 * 1024 * 1024
# Forking twice takes milliseconds; ten seconds means the container is starved or frozen.
HANDOFF_TIMEOUT = 10.0
# A SIGKILLed group is gone within milliseconds; past this a member is stuck in the kernel.
KILL_WAIT = 5.0
# After the group empties the supervisor reaps the shell at once; this only covers scheduling.
EXIT_RECORD_WAIT = 2.0
# No event says "this process group is now empty": group checks are polled at these intervals.
POLL_INTERVAL = 0.02
# Listening ports reported by ``list``; more is a container busy enough to count as not idle.
MAX_LISTENING = 256
SUPERVISOR_POLL_INTERVAL = 0.5
# Finished processes kept (with their logs) for list/read_output; older ones are forgotten.
MAX_FINISHED = 32
MIN_LOG_BYTES = 4096
PIPE_CHUNK = 64 * 1024
MAX_TAIL_LINES = 10_000
# Commands are echoed in list replies shortened to this, so a list stays small.
LIST_COMMAND_CHARS = 1024
# Two psutil readings of one process's create_time agree exactly; another process differs by ticks.
CREATE_TIME_TOLERANCE = 0.05
DROPPED_MARKER = re.compile(rb"^\[sandhold: (\d{1,20}) earlier bytes of output dropped\]\n")


class OpError(Exception):
    def __init__(self, error_type: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.extra = extra


# --- the registry -------------------------------------------------------------------------------


def _path(process_id: str, suffix: str) -> str:
    return os.path.join(STATE_DIR, process_id + suffix)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(STATE_DIR, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load(process_id: str) -> dict[str, Any] | None:
    try:
        with open(_path(process_id, ".json"), encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return None
    # Sandboxed code can write here too: a record that does not add up is no process of ours.
    return record if _well_formed(record, process_id) else None


def _well_formed(record: Any, process_id: str) -> bool:
    if not isinstance(record, dict) or record.get("process_id") != process_id:
        return False
    numbers = [record.get(key) for key in ("pid", "pgid", "create_time", "started_at")]
    exit_code = record.get("exit_code")
    return (
        all(isinstance(n, int | float) and not isinstance(n, bool) and n > 0 for n in numbers)
        and isinstance(record["pid"], int)
        and isinstance(record["pgid"], int)
        and isinstance(record.get("command"), str)
        and (exit_code is None or (isinstance(exit_code, int) and not isinstance(exit_code, bool)))
        and all(
            record.get(key) is None or isinstance(record.get(key), int | float)
            for key in ("exited_at", "ended_at")
        )
    )


def _save(record: dict[str, Any]) -> None:
    final = _path(record["process_id"], ".json")
    _write_whole(final, json.dumps(record).encode())


def _write_whole(path: str, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``; a reader sees the old file or the new one."""
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _update(process_id: str, *, only_missing: bool = False, **changes: Any) -> None:
    """Change fields of a record, if it still exists; ``only_missing`` keeps values already set."""
    with _locked():
        record = _load(process_id)
        if record is None:
            return
        for key, value in changes.items():
            if not only_missing or record.get(key) is None:
                record[key] = value
        _save(record)


def _records() -> list[dict[str, Any]]:
    try:
        names = os.listdir(STATE_DIR)
    except OSError:
        return []
    found = []
    for name in names:
        stem, dot, ext = name.partition(".")
        if ext == "json" and dot and PROCESS_ID.fullmatch(stem) and (record := _load(stem)):
            found.append(record)
    return sorted(found, key=lambda record: float(record.get("started_at", 0.0)))


def _forget(process_id: str) -> None:
    for suffix in (".json", ".log"):
        with contextlib.suppress(OSError):
            os.unlink(_path(process_id, suffix))


# --- process groups -----------------------------------------------------------------------------


def _group_alive(record: dict[str, Any]) -> bool:
    """Whether the recorded group still exists and is provably the one we started."""
    pid, pgid = int(record["pid"]), int(record["pgid"])
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        created = None
    except psutil.Error:
        return False
    if created is not None:
        # A live pid with another birth time is a reused number: our group is gone.
        return abs(created - float(record["create_time"])) < CREATE_TIME_TOLERANCE
    return _pgid_in_use(pgid)


def _signal_group(record: dict[str, Any], signum: int) -> bool:
    if not _group_alive(record):
        return False
    try:
        os.killpg(int(record["pgid"]), signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_empty(record: dict[str, Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _group_alive(record):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


def _members(pgid: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid:
                members.append(process)
        except (OSError, psutil.Error):
            continue
    return members


def _ports(record: dict[str, Any]) -> list[int]:
    ports: set[int] = set()
    for process in _members(int(record["pgid"])):
        try:
            connections = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for connection in connections:
            if connection.status == psutil.CONN_LISTEN and connection.laddr:
                ports.add(int(connection.laddr.port))
    return sorted(ports)


def _state(record: dict[str, Any]) -> str:
    if _group_alive(record):
        return "running"
    return "killed" if record.get("killed") else "exited"


def _summary(record: dict[str, Any], state: str) -> dict[str, Any]:
    started = float(record["started_at"])
    if state == "running":
        ended = time.time()
    else:
        ended = record.get("ended_at") or record.get("exited_at") or time.time()
    return {
        "process_id": record["process_id"],
        "state": state,
        "exit_code": None if state == "running" else record.get("exit_code"),
        "elapsed_s": round(max(0.0, float(ended) - started), 3),
        "ports": _ports(record) if state == "running" else [],
        "pid": int(record["pid"]),
        "command": str(record["command"])[:LIST_COMMAND_CHARS],
    }


# --- launching: the supervisor and the command --------------------------------------------------


class CappedLog:
    """An append-only log that never grows past ``cap`` bytes and always keeps the newest output."""

    def __init__(self, path: str, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.size = 0
        self.received = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def write(self, data: bytes) -> None:
        self.received += len(data)
        try:
            if self.size + len(data) > self.cap:
                self._rotate(data)
            else:
                _write_all(self.fd, data)
                self.size += len(data)
        except OSError:
            # A full tmpfs loses output; the command must not block or die for it.
            with contextlib.suppress(OSError):
                self.size = os.fstat(self.fd).st_size

    def _rotate(self, data: bytes) -> None:
        keep = self.cap // 2
        with open(self.path, "rb") as handle:
            handle.seek(max(0, self.size - keep))
            kept = (handle.read(keep) + data)[-keep:]
        newline = kept.find(b"\n")
        if 0 <= newline < len(kept) - 1:
            kept = kept[newline + 1 :]  # start at a whole line
        dropped = self.received - len(kept)
        content = b"[sandhold: %d earlier bytes of output dropped]\n" % dropped + kept
        _write_whole(self.path, content)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = len(content)


def _run_command(request: dict[str, Any], out_w: int, go_r: int) -> NoReturn:
    """In B: lead a new group, wait for the go byte, become ``bash -c COMMAND``."""
    try:
        os.setpgid(0, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        # Python ignores these; an exec'd command must get the default behaviour back.
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        if os.read(go_r, 1) != b"1":
            os._exit(127)
        os.chdir(request["cwd"])
        env = {**os.environ, **request["env"]}
        os.execve(BASH, ["bash", "-c", request["command"]], env)  # noqa: S606
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(2, f"sandhold: cannot start the command: {exc}\n".encode())
    os._exit(127)


def _watch(process_id: str, pid: int) -> None:
    """In S (a thread): record the shell's exit status, and when the whole group has ended."""
    _, status = os.waitpid(pid, 0)
    ended: dict[str, Any] = {
        "exit_code": os.waitstatus_to_exitcode(status),
        "exited_at": time.time(),
    }
    # The shell is reaped, so its pid (== the pgid) is not reused while the group has members.
    if _pgid_in_use(pid):
        _update(process_id, **ended)
        while _pgid_in_use(pid):
            time.sleep(SUPERVISOR_POLL_INTERVAL)
    _update(process_id, only_missing=True, **ended, ended_at=time.time())


def _pgid_in_use(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _supervise(request: dict[str, Any], handoff_w: int, go_r: int) -> None:
    """In S: start B, tell the ``start`` exec who B is, pump B's output into the capped log."""
    log = CappedLog(_path(request["process_id"], ".log"), int(request["max_log_bytes"]))
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(handoff_w)
        _run_command(request, out_w, go_r)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here, so the group exists before anyone is told of it
    os.close(out_w)
    os.close(go_r)
    os.write(handoff_w, f"{pid}\n".encode())
    os.close(handoff_w)
    watcher = threading.Thread(target=_watch, args=(request["process_id"], pid))
    watcher.start()
    while chunk := os.read(out_r, PIPE_CHUNK):
        log.write(chunk)
    watcher.join()


def _detach(request: dict[str, Any], handoff_w: int, go_r: int) -> NoReturn:
    """In A: a new session away from the exec's stdio, then S as an orphan for init to adopt."""
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        # Nothing of the exec may leak into S: not its pipes, not the registry lock held now.
        _close_fds_except({handoff_w, go_r})
        if os.fork() == 0:
            _supervise(request, handoff_w, go_r)
    finally:
        os._exit(0)


def _close_fds_except(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) not in keep:
            with contextlib.suppress(OSError):
                os.close(int(name))


def _read_handoff(fd: int) -> int:
    deadline = time.monotonic() + HANDOFF_TIMEOUT
    data = b""
    while not data.endswith(b"\n") and len(data) < 32:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise OpError("internal", "the process supervisor did not start in time")
        chunk = os.read(fd, 32)
        if not chunk:
            raise OpError("internal", "the process supervisor died while starting")
        data += chunk
    return int(data)


def _launch(request: dict[str, Any]) -> dict[str, Any]:
    handoff_r, handoff_w = os.pipe()
    go_r, go_w = os.pipe()
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        os.close(handoff_r)
        os.close(go_w)
        _detach(request, handoff_w, go_r)
    os.close(handoff_w)
    os.close(go_r)
    try:
        os.waitpid(child, 0)
        pid = _read_handoff(handoff_r)
        record = {
            "process_id": request["process_id"],
            "pid": pid,
            "pgid": os.getpgid(pid),
            "create_time": psutil.Process(pid).create_time(),
            "command": request["command"],
            "cwd": request["cwd"],
            "started_at": time.time(),
            "exit_code": None,
            "exited_at": None,
            "ended_at": None,
            "killed": False,
            "signal_used": None,
        }
        _save(record)
        os.write(go_w, b"1")
    finally:
        os.close(go_w)  # without the go byte, B exits 127 without running anything
        os.close(handoff_r)
    return record


# --- the operations -----------------------------------------------------------------------------


def _process_id(request: dict[str, Any]) -> str:
    process_id = request.get("process_id")
    if not isinstance(process_id, str) or not PROCESS_ID.fullmatch(process_id):
        raise OpError("session_not_found", "no such process")
    return process_id


def _known(request: dict[str, Any]) -> dict[str, Any]:
    record = _load(_process_id(request))
    if record is None:
        raise OpError("session_not_found", "no such process")
    return record


def _check_start(request: dict[str, Any]) -> None:
    _process_id(request)
    command, cwd, env = request.get("command"), request.get("cwd"), request.get("env")
    if not isinstance(command, str) or not command or "\0" in command:
        raise OpError("invalid_argument", "command must be a non-empty string")
    if not isinstance(cwd, str) or "\0" in cwd:
        raise OpError("invalid_argument", "cwd must be a string")
    real = os.path.realpath(cwd)
    if real != WORKSPACE and not real.startswith(WORKSPACE + "/"):
        raise OpError("invalid_argument", f"cwd resolves outside {WORKSPACE}")
    if not os.path.isdir(real):
        raise OpError("invalid_argument", "cwd is not an existing directory")
    request["cwd"] = real
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and "\0" not in k + v and "=" not in k
        for k, v in env.items()
    ):
        raise OpError("invalid_argument", "env must map names to strings")
    for key in ("max_log_bytes", "max_running"):
        value = request.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OpError("invalid_argument", f"{key} must be a positive integer")
    request["max_log_bytes"] = max(MIN_LOG_BYTES, request["max_log_bytes"])


def op_start(request: dict[str, Any]) -> dict[str, Any]:
    _check_start(request)
    with _locked():
        if _load(request["process_id"]) is not None:
            raise OpError("invalid_argument", "process id already in use")
        records = _records()
        running = [record for record in records if _group_alive(record)]
        if len(running) >= request["max_running"]:
            raise OpError("quota_exceeded", "too many running processes", running=len(running))
        finished = [record for record in records if record not in running]
        for record in finished[: max(0, len(finished) - MAX_FINISHED + 1)]:
            _forget(record["process_id"])
        record = _launch(request)
    return {
        "process_id": record["process_id"],
        "pid": record["pid"],
        "pgid": record["pgid"],
        "cwd": record["cwd"],
    }


def op_list(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "processes": [_summary(record, _state(record)) for record in _records()],
        "listening": _listening(),
    }


def _listening() -> list[int]:
    """Every TCP port something in the container listens on, background process or not (a
    server the REPL started counts too): the idle check's "is anyone serving here"."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return []
    ports = {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN and c.laddr}
    return sorted(ports)[:MAX_LISTENING]


def op_read_output(request: dict[str, Any]) -> dict[str, Any]:
    record = _known(request)
    tail, max_bytes = request.get("tail"), request.get("max_bytes")
    if isinstance(tail, bool) or not isinstance(tail, int) or not 1 <= tail <= MAX_TAIL_LINES:
        raise OpError("invalid_argument", f"tail must be an integer in [1, {MAX_TAIL_LINES}]")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise OpError("invalid_argument", "max_bytes must be a positive integer")
    try:
        with open(_path(record["process_id"], ".log"), "rb") as handle:
            head = handle.read(128)
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            handle.seek(start)
            data = handle.read(max_bytes)
    except FileNotFoundError:
        head, start, data = b"", 0, b""
    marker = DROPPED_MARKER.match(head)
    dropped = int(marker.group(1)) if marker else 0
    if start == 0 and marker:
        data = data[marker.end() :]
    lines = data.decode("utf-8", "replace").splitlines()
    cut = start > 0 and len(lines) > 1
    if cut:
        lines = lines[1:]  # the first line read from mid-file is partial
    kept = lines[-tail:]
    state = _state(record)
    return {
        **_summary(record, state),
        "output": "\n".join(kept),
        "lines": len(kept),
        "dropped_bytes": dropped,
        "truncated": len(kept) < tail and (start > 0 or dropped > 0),
    }


def op_kill(request: dict[str, Any]) -> dict[str, Any]:
    record = _known(request)
    grace = request.get("grace_s")
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 600:
        raise OpError("invalid_argument", "grace_s must be a number of seconds")
    process_id = record["process_id"]
    signal_used = None
    if _group_alive(record):
        _update(process_id, killed=True)
        if _signal_group(record, signal.SIGTERM):
            signal_used = "SIGTERM"
        if not _wait_empty(record, float(grace)) and _signal_group(record, signal.SIGKILL):
            signal_used = "SIGKILL"
        _update(process_id, signal_used=signal_used)
    group_empty = _wait_empty(record, KILL_WAIT)
    if group_empty:
        _wait_exit_recorded(process_id)
        _update(process_id, only_missing=True, ended_at=time.time())
    record = _load(process_id) or record
    return {
        **_summary(record, _state(record)),
        "signal_used": signal_used,
        "group_empty": group_empty,
    }


def _wait_exit_recorded(process_id: str) -> None:
    deadline = time.monotonic() + EXIT_RECORD_WAIT
    while time.monotonic() < deadline:
        record = _load(process_id)
        if record is None or record.get("exit_code") is not None:
            return
        time.sleep(POLL_INTERVAL)


OPS = {"start": op_start, "list": op_list, "read_output": op_read_output, "kill": op_kill}


def main(argv: list[str]) -> int:
    try:
        if len(argv) != 2 or argv[1] not in OPS:
            raise OpError("invalid_argument", f"usage: procs.py {{{','.join(OPS)}}}")
        raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        if len(raw) > MAX_REQUEST_BYTES:
            raise OpError("invalid_argument", "request too large")
        try:
            request = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            raise OpError("invalid_argument", "the request is not valid JSON") from None
        if not isinstance(request, dict):
            raise OpError("invalid_argument", "the request must be a JSON object")
        reply: dict[str, Any] = {"ok": True, **OPS[argv[1]](request)}
    except OpError as exc:
        reply = {"ok": False, "error_type": exc.error_type, "error_message": str(exc), **exc.extra}
    except Exception as exc:
        reply = {"ok": False, "error_type": "internal", "error_message": repr(exc)[:500]}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
