"""A virtualenv per pinned E2B SDK version, for the versions sandhold's own environment does
not carry (its test extra pins the newest): made once from PyPI under the user cache dir,
keyed by the pins and the interpreter, and reused by every later run; ``e2b_sdk_driver.py``
runs in it against a real server.

Only one test run makes a given virtualenv; the others wait on its lock, then reuse it. A
virtualenv is used only once its ``ready`` mark exists, so an interrupted install is redone."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).with_name("e2b_sdk_driver.py")
# A pip install of the SDK from PyPI: ~20 s here; bounded well past that.
INSTALL_TIMEOUT = 600
# A driver scenario: sandboxes made and killed, or the python-data template built on first use.
DRIVER_TIMEOUT = 900


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sandhold-test-venvs"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def sdk_python(pins: tuple[str, ...]) -> Path:
    """The interpreter of a virtualenv holding exactly ``pins`` (and their dependencies)."""
    key = hashlib.sha256(repr((pins, sys.version)).encode()).hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"e2b-{key}"
    python = venv / "bin" / "python"
    with _locked(root / f"e2b-{key}.lock"):
        if not (venv / "ready").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            installed = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", *pins],
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
            )
            if installed.returncode != 0:
                pytest.fail(f"could not install {pins}: {installed.stderr[-2000:]}", pytrace=False)
            (venv / "ready").write_text("\n".join(pins))
    return python


def drive(python: Path, scenario: str, env: Mapping[str, str], stderr_to: Path) -> Any:
    """One scenario of ``e2b_sdk_driver.py`` in ``python``'s virtualenv: what it printed."""
    with stderr_to.open("wb") as stderr:
        done = subprocess.run(
            [str(python), str(DRIVER), scenario],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=DRIVER_TIMEOUT,
            check=False,
        )
    assert done.returncode == 0, stderr_to.read_text()[-4000:]
    # The answer is the last line: an SDK may print notices of its own before it.
    return json.loads(done.stdout.splitlines()[-1])
