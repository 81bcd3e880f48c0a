"""A real ``sandhold serve --e2b-port 0`` for the E2B SDK tests: two tenants with
``e2b_``-shaped keys, the three variables a client sets, and the server stopped (SIGTERM,
bounded, then killed) with every container it made."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator._core.tenants import hash_key
from tests.conftest import RUN_ID, TEST_RUN_LABEL

STARTUP_TIMEOUT = 120
STOP_TIMEOUT = 60


@dataclass
class E2bServer:
    url: str
    keys: dict[str, str]
    orchestrator_id: str
    # The same server's REST, /mcp and ops address.
    rest_url: str = ""

    def env(self, tenant: str = "team-a") -> dict[str, str]:
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url,
                "E2B_API_KEY": self.keys[tenant]}  # fmt: skip


def e2b_key() -> str:
    return "e2b_" + secrets.token_hex(20)


def _tenants_file(path: Path, keys: dict[str, str], quotas: dict[str, int] | None = None) -> None:
    limits = "".join(f"{name} = {value}\n" for name, value in (quotas or {}).items())
    path.write_text("".join(
        f'[[tenant]]\nname = "{name}"\nkey_sha256 = "{hash_key(key)}"\n'
        + (f"[tenant.quotas]\n{limits}" if limits else "") + "\n"
        for name, key in keys.items()
    ))  # fmt: skip


def _read_until_e2b_line(process: subprocess.Popen[str]) -> tuple[str, str]:
    """The E2B and the REST address, from the start-up lines up to the one naming the E2B
    address, read in a thread so that the wait is bounded even when the server prints nothing."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        # Reads to the end: a pipe nobody drains would stall the server once its log fills it.
        assert process.stdout is not None
        for line in process.stdout:
            if not found.is_set():
                seen.append(line)
            if "E2B protocol on" in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(STARTUP_TIMEOUT):
        raise AssertionError(f"no E2B address within {STARTUP_TIMEOUT} s: {''.join(seen)}")
    match = re.search(r"E2B protocol on (http://127\.0\.0\.1:\d+)", "".join(seen))
    rest = re.search(r"listening on (http://127\.0\.0\.1:\d+)", "".join(seen))
    assert match and rest, seen
    return match.group(1), rest.group(1)


@contextlib.contextmanager
def e2b_server(
    image: str, tmp_path: Path, *, set_env: bool = True, quotas: dict[str, int] | None = None
) -> Iterator[E2bServer]:
    """``quotas``: each tenant's (the tenants file's ``[tenant.quotas]``), none by default."""
    keys = {"team-a": e2b_key(), "team-b": e2b_key()}
    tenants = tmp_path / "tenants.toml"
    _tenants_file(tenants, keys, quotas)
    orchestrator_id = f"test-e2b-{RUN_ID}-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "SANDHOLD_IMAGE": image,
        "SANDHOLD_ORCHESTRATOR_ID": orchestrator_id,
        "SANDHOLD_EXTRA_LABELS": f"{TEST_RUN_LABEL}={RUN_ID}",
        "SANDHOLD_DATA_DIR": str(tmp_path / "data"),
    }
    command = [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1",
               "--port", "0", "--e2b-port", "0", "--tenants", str(tenants)]  # fmt: skip
    with (tmp_path / "serve.stderr").open("w") as stderr:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
        try:
            e2b_url, rest_url = _read_until_e2b_line(process)
            server = E2bServer(e2b_url, keys, orchestrator_id, rest_url)
            if set_env:
                os.environ.update(server.env())
            yield server
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT)
