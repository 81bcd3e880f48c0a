"""Virtualenvs of pinned clients from PyPI (an older E2B SDK, an agent framework) that sandhold's
own environment does not carry: made once under the user cache dir, keyed by a name, the pins
and the interpreter, and reused by every later run.

Only one test run makes a given virtualenv; the others wait on its lock, then reuse it. A
virtualenv is used only once its ``ready`` mark exists, so an interrupted install is redone."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# A pip install of a client from PyPI: ~20 s here; bounded well past that.
INSTALL_TIMEOUT = 600


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


def pinned_python(name: str, pins: tuple[str, ...]) -> Path:
    """The interpreter of the virtualenv ``name`` holding exactly ``pins`` (and their
    dependencies); a failed install fails the test that asked."""
    key = hashlib.sha256(repr((pins, sys.version)).encode()).hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"{name}-{key}"
    python = venv / "bin" / "python"
    with _locked(root / f"{name}-{key}.lock"):
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
