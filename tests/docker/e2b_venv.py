"""A virtualenv per pinned E2B SDK version, for the versions sandhold's own environment does
not carry (its test extra pins the newest; ``tests/pinned_venv.py`` makes and keeps it);
``e2b_sdk_driver.py`` runs in it against a real server."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.pinned_venv import pinned_python

DRIVER = Path(__file__).with_name("e2b_sdk_driver.py")
# A driver scenario: sandboxes made and killed, or the python-data template built on first use.
DRIVER_TIMEOUT = 900


def sdk_python(pins: tuple[str, ...]) -> Path:
    """The interpreter of a virtualenv holding exactly ``pins`` (and their dependencies)."""
    return pinned_python("e2b", pins)


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
