"""One name for the server's address (issue 32.6): ``sandhold call`` reads ``SANDHOLD_URL``, as
the Sandbox API does; the old ``SANDHOLD_SERVER`` still works and says it is deprecated; the
``--server`` option wins over both. Checked through the entry point against a loopback port
nothing listens on: the error names the address the command used."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

SANDHOLD = [sys.executable, "-m", "orchestrator.cli"]
# One CLI process: the interpreter's imports and one refused connection.
CALL_TIMEOUT = 60


def refused_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def call(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SANDHOLD_URL", "SANDHOLD_SERVER")}
    env |= {"SANDHOLD_API_KEY": "sandhold_" + "k" * 40, **variables}
    return subprocess.run(
        [*SANDHOLD, "call", "python_repl", '{"operation": "list_sessions"}', *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize("variable", ["SANDHOLD_URL", "SANDHOLD_SERVER"])
def test_sandhold_call_finds_the_server_by_its_variable(variable: str) -> None:
    url = refused_url()
    done = call(**{variable: url})
    assert done.returncode == 2
    assert f"error: backend_unavailable: cannot reach sandhold at {url}" in done.stderr
    deprecated = "SANDHOLD_SERVER is deprecated; set SANDHOLD_URL instead" in done.stderr
    assert deprecated == (variable == "SANDHOLD_SERVER")


def test_the_server_option_wins_over_the_variable() -> None:
    given, other = refused_url(), "http://127.0.0.1:9"
    done = call("--server", given, SANDHOLD_URL=other)
    assert f"cannot reach sandhold at {given}" in done.stderr and other not in done.stderr
