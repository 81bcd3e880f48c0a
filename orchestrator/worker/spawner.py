"""The session's process spawner: one long-lived helper that starts commands inside the sandbox
and streams their output, so a command costs a line on an open stream instead of a ``docker
exec`` (as E2B's envd spawns its processes).

Started as ``python3 -I /opt/sandhold/worker/spawner.py <idle_s>`` (an attached exec, the
sandbox user); with no process running and no request for ``idle_s`` it exits, so an idle
session does not keep it (the host starts a fresh one for its next command).
Stdlib only. Requests are JSON lines on stdin, each with an ``id`` and an ``op``:

- ``start``: ``argv``, ``env`` (set over this helper's own environment), ``cwd``, ``pty``
  (``[rows, cols]`` or null); answered ``{"id", "ok": true, "pid"}``. The process leads a new
  session and process group (its pid is the group's id); stdout and stderr share one pipe (or
  the PTY), so their output keeps the order it was written in.
- ``input`` (``pid``, ``data`` in base64), ``eof`` (``pid``), ``signal`` (``pid``, ``signal``
  a number, sent to the group), ``resize`` (``pid``, ``rows``, ``cols``).

Besides the replies it writes events, lines without an id: ``{"ev": "out", "pid", "data"}``
(base64, at most ``READ_BYTES`` of output) and ``{"ev": "exit", "pid", "code"}`` (the exit
status, ``128 + n`` for a process ended by signal ``n``), sent once the process is reaped and
what was in its pipe is out; output written later by a process it left behind is not read.

Invariants: one thread and one ``select`` loop; no write blocks it (stdin of a child and our own
stdout are buffered, bounded); while our stdout holds more than ``OUT_HIGH`` bytes no child's
output is read (the host reads slower than commands print: they wait, nothing is lost). The
helper exits at EOF on its stdin, killing the process groups it started.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import termios
import time
from typing import Any

READ_BYTES = 32 * 1024
# Our own stdout past this stops reading children: the host is behind; they wait for it.
OUT_HIGH = 1 << 20
# What one child's stdin may hold unread before ``input`` is refused (it is not reading).
MAX_STDIN_BUFFER = 1 << 20
MAX_REQUEST_BYTES = 4 << 20
MAX_PROCESSES = 1024
# A day without a command is not a session at work (the host asks for far less).
MAX_IDLE_S = 86_400.0
# How soon a full pipe (our stdout, a child's stdin) is looked at again.
POLL_S = 0.01


class OpError(Exception):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class Child:
    def __init__(self, popen: subprocess.Popen[bytes], out_fd: int, in_fd: int | None) -> None:
        self.popen = popen
        self.out_fd = out_fd
        self.in_fd = in_fd  # the PTY's master (== out_fd) or the stdin pipe; None once closed
        self.pending_in = b""
        self.eof_after_input = False
        self.code: int | None = None
        self.out_open = True


class Spawner:
    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.last_request = time.monotonic()
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, Child] = {}
        self.out = bytearray()
        self.inbuf = bytearray()
        self.paused = False
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w, 0, 1):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(0, selectors.EVENT_READ, "stdin")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    # -- output to the host -----------------------------------------------------------------

    def emit(self, message: dict[str, Any]) -> None:
        self.out += json.dumps(message, separators=(",", ":")).encode() + b"\n"

    def flush(self) -> None:
        while self.out:
            try:
                sent = os.write(1, self.out[: READ_BYTES * 4])
            except BlockingIOError:
                return
            except BrokenPipeError:
                self.shutdown(0)
            del self.out[:sent]

    # -- requests ---------------------------------------------------------------------------

    def read_requests(self) -> None:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return
        if not data:
            self.shutdown(0)
        self.inbuf += data
        self.last_request = time.monotonic()
        while (end := self.inbuf.find(b"\n")) >= 0:
            line = bytes(self.inbuf[:end])
            del self.inbuf[: end + 1]
            self.handle_line(line)
        if len(self.inbuf) > MAX_REQUEST_BYTES:
            self.shutdown(2)  # the host never sends such a line: it is out of step

    def handle_line(self, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            return
        if not isinstance(request, dict) or not isinstance(request.get("id"), str):
            return
        reply: dict[str, Any] = {"id": request["id"]}
        try:
            reply.update(self.handle(str(request.get("op")), request))
            reply["ok"] = True
        except OpError as exc:
            reply.update(ok=False, error_type=exc.error_type, error_message=str(exc))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            reply.update(ok=False, error_type="internal", error_message=repr(exc)[:500])
        self.emit(reply)

    def handle(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        if op == "start":
            return {"pid": self.start(request)}
        child = self.child(request.get("pid"))
        if op == "input":
            data = base64.b64decode(request["data"], validate=True)
            if child.in_fd is None or child.eof_after_input:
                raise OpError("invalid_argument", "the process's input is closed")
            if len(child.pending_in) + len(data) > MAX_STDIN_BUFFER:
                raise OpError("invalid_argument", "the process is not reading its input")
            child.pending_in += data
            self.write_input(child)
        elif op == "eof":
            child.eof_after_input = True
            self.write_input(child)
        elif op == "signal":
            try:
                os.killpg(child.popen.pid, int(request["signal"]))
            except ProcessLookupError:
                return {"found": False}
        elif op == "resize":
            if child.in_fd is None or child.in_fd != child.out_fd:
                raise OpError("invalid_argument", "the process has no PTY")
            size = struct.pack("HHHH", int(request["rows"]), int(request["cols"]), 0, 0)
            fcntl.ioctl(child.out_fd, termios.TIOCSWINSZ, size)
        else:
            raise OpError("invalid_argument", f"unknown operation {op!r}")
        return {}

    def child(self, pid: object) -> Child:
        found = self.children.get(pid) if isinstance(pid, int) else None
        if found is None or found.code is not None:
            raise OpError("invalid_argument", f"no running process {pid}")
        return found

    def start(self, request: dict[str, Any]) -> int:
        argv, env, cwd = request["argv"], request.get("env") or {}, request.get("cwd")
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise OpError("invalid_argument", "argv must be a list of strings")
        if len(self.children) >= MAX_PROCESSES:
            raise OpError("quota_exceeded", f"{MAX_PROCESSES} processes are already running")
        if cwd is not None and not os.path.isdir(cwd):
            raise OpError("invalid_argument", f"cwd {cwd} is not a directory in the session")
        full_env = {**os.environ, **{str(k): str(v) for k, v in dict(env).items()}}
        pty = request.get("pty")
        if pty:
            return self.start_pty(argv, full_env, cwd, int(pty[0]), int(pty[1]))
        out_r, out_w = os.pipe()
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out_w,
                stderr=out_w,
                cwd=cwd,
                env=full_env,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(out_r)
            raise OpError("invalid_argument", f"cannot start {argv[0]}: {exc.strerror}") from None
        finally:
            os.close(out_w)
        assert popen.stdin is not None
        in_fd = os.dup(popen.stdin.fileno())
        popen.stdin.close()
        return self.adopt(Child(popen, out_r, in_fd))

    def start_pty(
        self, argv: list[str], env: dict[str, str], cwd: str | None, rows: int, cols: int
    ) -> int:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

        def controlling_tty() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            popen = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=controlling_tty,
            )
        except OSError as exc:
            os.close(master)
            raise OpError("invalid_argument", f"cannot start {argv[0]}: {exc.strerror}") from None
        finally:
            os.close(slave)
        return self.adopt(Child(popen, master, master))

    def adopt(self, child: Child) -> int:
        os.set_blocking(child.out_fd, False)
        if child.in_fd is not None and child.in_fd != child.out_fd:
            os.set_blocking(child.in_fd, False)
        self.children[child.popen.pid] = child
        if not self.paused:
            self.sel.register(child.out_fd, selectors.EVENT_READ, child)
        return child.popen.pid

    # -- children ---------------------------------------------------------------------------

    def write_input(self, child: Child) -> None:
        fd = child.in_fd
        if fd is None:
            return
        while child.pending_in:
            try:
                sent = os.write(fd, child.pending_in[:65536])
            except BlockingIOError:
                break
            except OSError:  # it closed its input: what it did not read is dropped
                child.pending_in = b""
                break
            child.pending_in = child.pending_in[sent:]
        if not child.pending_in and child.eof_after_input and fd != child.out_fd:
            os.close(fd)
            child.in_fd = None

    def read_output(self, child: Child) -> bool:
        """One read of the child's output, sent on; False when there was none to read now, or
        at its end (then it is not read again: the exit event follows its reaping). A PTY whose
        last holder closed it says EIO under Linux, and under gVisor only has nothing to read."""
        if not child.out_open:
            return False
        try:
            data = os.read(child.out_fd, READ_BYTES)
        except BlockingIOError:
            return False
        except OSError:  # EIO: the PTY's last holder closed it
            data = b""
        if not data:
            child.out_open = False
            if not self.paused:
                self.sel.unregister(child.out_fd)
            return False
        self.emit({"ev": "out", "pid": child.popen.pid, "data": base64.b64encode(data).decode()})
        return True

    def reap(self) -> None:
        for pid, child in list(self.children.items()):
            if child.popen.poll() is not None:
                code = child.popen.returncode
                child.code = 128 - code if code < 0 else code
                self.finish(pid, child)

    def finish(self, pid: int, child: Child) -> None:
        while self.read_output(child):  # what it wrote before it ended is in the pipe now
            self.flush()
        if child.out_open and not self.paused:
            self.sel.unregister(child.out_fd)
        os.close(child.out_fd)
        if child.in_fd is not None and child.in_fd != child.out_fd:
            os.close(child.in_fd)
        del self.children[pid]
        self.emit({"ev": "exit", "pid": pid, "code": child.code})

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading children's output while the host is behind."""
        if paused == self.paused:
            return
        self.paused = paused
        for child in self.children.values():
            if child.out_open and paused:
                self.sel.unregister(child.out_fd)
            elif child.out_open:
                self.sel.register(child.out_fd, selectors.EVENT_READ, child)

    def shutdown(self, status: int) -> None:
        for pid in list(self.children):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        os._exit(status)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            self.flush()
            self.pause(len(self.out) > OUT_HIGH)
            waiting_in = False
            for child in self.children.values():
                self.write_input(child)
                waiting_in = waiting_in or bool(child.pending_in)
            # Our stdout or a child's stdin is full: look again soon (they are rare and short).
            timeout = POLL_S if self.out or waiting_in else self.idle_left()
            for key, _ in self.sel.select(timeout):
                if key.data == "stdin":
                    self.read_requests()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                else:
                    self.read_output(key.data)
            self.reap()
            left = self.idle_left()
            if left is not None and left <= 0 and not self.out:
                self.shutdown(0)

    def idle_left(self) -> float | None:
        """Seconds until an idle exit; None while a process runs."""
        if self.children:
            return None
        return max(0.0, self.last_request + self.idle_s - time.monotonic())


def main() -> int:
    try:
        idle_s = float(sys.argv[1])
    except (IndexError, ValueError):
        print("usage: spawner.py <idle_s>", file=sys.stderr)
        return 2
    Spawner(idle_s if 0 < idle_s <= MAX_IDLE_S else MAX_IDLE_S).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
