"""Write a template's lock file::

    python images/lock_template.py images/templates/python-data.toml

For maintainers, run by hand when a template's ``packages`` change or its pins should move on; the
image build only reads the lock this writes. pip's resolver picks the versions (``pip install
--dry-run --report``, which reads metadata, not whole wheels) for every Python of ``PYTHONS``;
they must agree. The index's JSON listing (PEP 691) then gives the sha256 of every wheel of each
pinned version that fits one of the ``TARGETS``, and each target must have a wheel of every pin.
Also pins the pip that installs them inside the build (``pip.lock``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from orchestrator.images.lockfile import Pin, canonical_name, render_lock  # noqa: E402

INDEX = "https://pypi.org/simple"
# The Pythons of the bases sandhold builds on: Debian bookworm's python3 (3.11), the pinned
# official image (3.12) and Debian trixie's (3.13).
PYTHONS = ("3.11", "3.12", "3.13")
MACHINES = ("x86_64", "aarch64")
# Manylinux levels up to bookworm's glibc (2.36): what every base above can load.
MAX_GLIBC_MINOR = 36
PIP_VERSION_SPEC = "pip"
_WHEEL = re.compile(
    r"^(?P<dist>.+?)-(?P<ver>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


def platforms(machine: str) -> list[str]:
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(17, MAX_GLIBC_MINOR + 1)]
    return [*tags, f"manylinux2014_{machine}"]


def resolve(packages: list[str], python: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        argv = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--quiet", "--only-binary=:all:", "--index-url", INDEX,
            "--python-version", python, "--target", str(Path(scratch) / "t"),
            *[arg for plat in platforms("x86_64") for arg in ("--platform", plat)],
            "--report", str(report), *packages,
        ]  # fmt: skip
        # Only the index: a machine's own find-links folder would make its lock differ.
        env = {key: value for key, value in os.environ.items() if key != "PIP_FIND_LINKS"}
        subprocess.run(argv, check=True, env=env)
        data = json.loads(report.read_text())
    return {
        canonical_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in data["install"]
    }


def listing(name: str) -> list[dict[str, object]]:
    request = urllib.request.Request(  # noqa: S310 (the index, https)
        f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (the index, https)
        return list(json.load(answer)["files"])


def fits(py: str, abi: str, plat: str, python: str, machine: str) -> bool:
    """Whether a wheel of these tags installs on ``python`` for ``machine`` (glibc)."""
    cp = "cp" + python.replace(".", "")
    pys, abis = set(py.split(".")), set(abi.split("."))
    stable = {tag for tag in pys if re.fullmatch(r"cp3\d+", tag) and int(tag[3:]) <= int(cp[3:])}
    python_ok = (
        (cp in pys and cp in abis)
        or ("abi3" in abis and bool(stable))
        or ("none" in abis and bool(pys & {"py3", "py2", cp}))
    )
    plat_ok = any(tag == "any" or tag in platforms(machine) for tag in plat.split("."))
    return python_ok and plat_ok


def pin(name: str, version: str) -> Pin:
    hashes: set[str] = set()
    covered: set[tuple[str, str]] = set()
    for file in listing(name):
        found = _WHEEL.match(str(file["filename"]))
        if found is None or canonical_name(found["dist"]) != name or found["ver"] != version:
            continue
        targets = {
            (python, machine)
            for python in PYTHONS
            for machine in MACHINES
            if fits(found["py"], found["abi"], found["plat"], python, machine)
        }
        if targets:
            hashes.add(str(file["hashes"]["sha256"]))  # type: ignore[index]
            covered |= targets
    missing = {(p, m) for p in PYTHONS for m in MACHINES} - covered
    if missing:
        raise SystemExit(f"{name}=={version} has no wheel for {sorted(missing)}")
    return Pin(name, version, tuple(sorted(hashes)))


def main(template_path: Path) -> None:
    template = tomllib.loads(template_path.read_text())
    packages = list(template["packages"])
    resolved = [resolve(packages, python) for python in PYTHONS]
    if any(found != resolved[0] for found in resolved):
        raise SystemExit(f"the Pythons resolve {packages} differently: {resolved}")
    pins = [pin(name, version) for name, version in sorted(resolved[0].items())]
    header = (
        f"Written by images/lock_template.py from {template_path.name} ({', '.join(packages)}):\n"
        "every wheel, dependencies included, for Python "
        f"{', '.join(PYTHONS)} on {', '.join(MACHINES)} (glibc). Do not edit by hand."
    )
    lock = template_path.parent / template["lock"]
    lock.write_text(render_lock(pins, header=header))
    print(f"wrote {lock}: {len(pins)} pins")
    pip_version = resolve([PIP_VERSION_SPEC], PYTHONS[0])["pip"]
    pip_lock = template_path.parent / "pip.lock"
    pip_header = (
        "The pip that installs a template's wheels inside the build (images/lock_template.py)."
    )
    pip_lock.write_text(render_lock([pin("pip", pip_version)], header=pip_header))
    print(f"wrote {pip_lock}: pip {pip_version}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
