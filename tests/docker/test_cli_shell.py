"""``sandhold shell`` as a person uses it: on a pseudo-terminal of the test's, typing into a shell
in a new sandbox (raw mode: Ctrl-C reaches the sandbox, not sandhold), the window size following the
terminal's, the shell's exit status passed through, the terminal restored and no container left.
Without a terminal (a pipe) it runs the piped lines the same way."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pty
import re
import secrets
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator

import docker
import pytest

from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_RUN_LABEL

pytestmark = pytest.mark.docker

SHELL = [sys.executable, "-m", "orchestrator.cli", "shell"]
# The CLI's imports, the engine ping and one cold session.
START_TIMEOUT = 60.0
STEP_TIMEOUT = 20.0
# Removing the session and the container after the shell has exited.
EXIT_TIMEOUT = 60.0
CASE_LABEL = "sandhold.test-case"
PROMPT = re.compile(rb"\$ $")
# A line of output; bash may put bracketed-paste switches (ESC [ ? 2004 l, then CR) before it.
LINE = rb"[\r\n]%s\r\n"


def shell_env(image: str, case: str) -> dict[str, str]:
    return {
        **os.environ,
        "SANDHOLD_IMAGE": image,
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID},{CASE_LABEL}={case}",
        "TERM": "xterm",
    }


def containers_of_case(case: str) -> list[str]:
    client = docker.from_env(timeout=10)
    try:
        found = client.api.containers(all=True, filters={"label": f"{CASE_LABEL}={case}"})
        return [c["Id"] for c in found]
    finally:
        client.close()


def set_window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """The test's side of a pseudo-terminal that ``sandhold shell`` runs on."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.seen = b""
        self.transcript = b""

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: re.Pattern[bytes], timeout: float = STEP_TIMEOUT) -> re.Match[bytes]:
        """Read until ``pattern`` matches what came since the last match; consume up to it."""
        deadline = time.monotonic() + timeout
        while not (found := pattern.search(self.seen)):
            if not self._read(deadline - time.monotonic()):
                raise AssertionError(f"{pattern.pattern!r} not seen in {self.transcript[-2000:]!r}")
        self.seen = self.seen[found.end() :]
        return found

    def wait_exit(self, timeout: float = EXIT_TIMEOUT) -> int:
        """Read until sandhold closes the terminal, then its exit status."""
        deadline = time.monotonic() + timeout
        while self._read(deadline - time.monotonic()):
            pass
        assert time.monotonic() < deadline, (
            f"sandhold shell did not exit: {self.transcript[-2000:]!r}"
        )
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)

    def _read(self, timeout: float) -> bool:
        """False at the end (EOF, EIO once the other side is closed) or when time is up."""
        if timeout <= 0 or not select.select([self.fd], [], [], timeout)[0]:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return False
            raise
        self.seen += data
        self.transcript += data
        return bool(data)


@contextlib.contextmanager
def sandhold_shell_on_a_terminal(env: dict[str, str], rows: int, cols: int) -> Iterator[Terminal]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: only what must happen before exec
        try:
            set_window(0, rows, cols)
            os.execve(SHELL[0], SHELL, env)
        finally:
            os._exit(127)
    term = Terminal(pid, fd)
    try:
        yield term
    finally:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):  # a failed test: let sandhold tear down
                os.kill(pid, signal.SIGTERM)
                with contextlib.suppress(AssertionError):
                    term.wait_exit()
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        os.close(fd)


def test_a_shell_on_a_terminal_runs_what_is_typed_and_exits_with_its_status(
    worker_image: ImageBuildResult,
) -> None:
    case = secrets.token_hex(6)
    with sandhold_shell_on_a_terminal(shell_env(worker_image.tag, case), 30, 100) as term:
        term.expect(PROMPT, START_TIMEOUT)
        assert len(containers_of_case(case)) == 1
        assert not termios.tcgetattr(term.fd)[3] & termios.ICANON  # raw while attached

        term.type("echo $((6*7))\r")
        term.expect(re.compile(LINE % rb"42"))
        term.expect(PROMPT)

        term.type("stty size\r")
        term.expect(re.compile(LINE % rb"30 100"))
        term.expect(PROMPT)

        # Ctrl-C goes to the sandbox's foreground command, not to sandhold (once it is running: a
        # Ctrl-C that comes before the command has the terminal goes to bash, which ignores it).
        term.type("sh -c 'echo $((1+1))-ready; exec sleep 60'; echo not-interrupted\r")
        term.expect(re.compile(LINE % rb"2-ready"))
        term.type("\x03")
        term.expect(PROMPT)
        assert b"not-interrupted\r\n" not in term.seen

        set_window(term.fd, 40, 120)  # the kernel tells sandhold with SIGWINCH
        sized = re.compile(LINE % rb"(\d+ \d+)")
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:  # SIGWINCH and the keys race; ask until the new size has arrived
            term.type("stty size\r")
            size = term.expect(sized).group(1)
            term.expect(PROMPT)
            if size == b"40 120" or time.monotonic() > deadline:
                break
        assert size == b"40 120"

        term.type("exit 3\r")
        assert term.wait_exit() == 3
        attributes = termios.tcgetattr(term.fd)[3]
        assert attributes & termios.ICANON and attributes & termios.ECHO  # restored
    assert containers_of_case(case) == []


def test_a_shell_reading_a_pipe_runs_its_lines(worker_image: ImageBuildResult) -> None:
    case = secrets.token_hex(6)
    done = subprocess.run(
        SHELL,
        input=b"cd /tmp\necho $((6*7)) in $PWD\nexit 3\n",
        env=shell_env(worker_image.tag, case),
        capture_output=True,
        timeout=START_TIMEOUT + EXIT_TIMEOUT,
    )
    assert done.returncode == 3, done.stderr
    assert b"42 in /tmp\n" in done.stdout and b"\r" not in done.stdout
    assert b"echo" not in done.stdout  # no echo of the input
    assert containers_of_case(case) == []
