"""Where the base image comes from, decided without touching anything (pure): the planner reads
what the host has and returns the ordered candidates, with the exact commands each would run;
``base.py`` carries them out. Keeping the decision pure lets a unit test state every branch
(pull, debootstrap present, debootstrap installable, neither) with the real argv.

Order, cheapest and most reproducible first:
1. a base given by the user (``--base-image``, ``SANDHOLD_BASE_IMAGE``, ``BASE_IMAGE``): local, else
   pulled;
2. an image already on the engine: the pinned official Python image, else ``sandhold-base:<suite>``;
3. the pinned official Python image, pulled (fails at once where no registry answers);
4. ``sandhold-base:<suite>`` from debootstrap, installing the Debian package first when this process
   is root on a system with apt-get;
5. otherwise nothing can be done here, and the error names the one command that would fix it.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import ImageToolMissingError
from orchestrator.images.debootstrap import base_tag

__all__ = [
    "APT_ENV",
    "APT_INSTALL_DEBOOTSTRAP",
    "APT_UPDATE",
    "PINNED_PYTHON_IMAGE",
    "Candidate",
    "Debootstrap",
    "HostTools",
    "NoWayHere",
    "Pull",
    "UseLocal",
    "plan_base",
]

# The official image, pinned by digest so every host that can pull gets the same bytes. The tag
# beside the digest is for people; the engine resolves the digest alone. Where no registry answers
# the pull fails at once and the Debian base is built instead.
PINNED_PYTHON_IMAGE = (
    "python:3.12-slim-bookworm"
    "@sha256:34386ef0cb081344d7ec1c103ba398e6e9f64e9ab3a1509accc92a4e24a07258"
)
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
APT_UPDATE = ("apt-get", "update", "-q")
APT_INSTALL_DEBOOTSTRAP = (
    "apt-get",
    "install",
    "-y",
    "-q",
    "--no-install-recommends",
    "debootstrap",
)


@dataclass(frozen=True)
class HostTools:
    """What the host offers for building a base: found paths, and whether this process is root."""

    debootstrap: str | None
    apt_get: str | None
    is_root: bool


@dataclass(frozen=True)
class UseLocal:
    """An image the engine already has."""

    ref: str


@dataclass(frozen=True)
class Pull:
    """Pull ``ref``; on failure go on to the next candidate unless ``final``."""

    ref: str
    final: bool = False


@dataclass(frozen=True)
class Debootstrap:
    """Bootstrap ``suite``; ``install`` holds the commands that put debootstrap on the host
    first (empty when it is there)."""

    suite: str
    install: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class NoWayHere:
    """Nothing left to try on this host: the error to raise, naming the command that fixes it."""

    message: str
    hint: str

    def error(self) -> ImageToolMissingError:
        return ImageToolMissingError(self.message, hint=self.hint)


Candidate = UseLocal | Pull | Debootstrap | NoWayHere


def plan_base(
    *,
    given: str | None,
    given_is_local: bool,
    local: frozenset[str],
    suite: str,
    tools: HostTools,
) -> tuple[Candidate, ...]:
    """The candidates to try in order, the last one final. ``local`` holds which of the pinned
    Python image and ``sandhold-base:<suite>`` the engine already has."""
    if given and given_is_local:
        return (UseLocal(given),)
    candidates: list[Candidate] = [Pull(given)] if given else []
    for ref in (PINNED_PYTHON_IMAGE, base_tag(suite)):
        if ref in local:
            return (*candidates, UseLocal(ref))
    candidates.append(Pull(PINNED_PYTHON_IMAGE))
    candidates.append(_debootstrap(suite, tools))
    return tuple(candidates)


def _debootstrap(suite: str, tools: HostTools) -> Debootstrap | NoWayHere:
    if not tools.is_root:
        return NoWayHere(
            "no base image: none is on the engine, none could be pulled, and building one from "
            "Debian packages (debootstrap) needs root",
            hint="run `sudo sandhold image build` once, or pass --base-image with an image of "
            "yours",
        )
    if tools.debootstrap is not None:
        return Debootstrap(suite)
    if tools.apt_get is not None:
        return Debootstrap(suite, install=(APT_UPDATE, APT_INSTALL_DEBOOTSTRAP))
    return NoWayHere(
        "no base image: none is on the engine, none could be pulled, and debootstrap (which "
        "builds one from Debian packages) is not installed and there is no apt-get to install it",
        hint="install debootstrap with this system's package manager, or pass --base-image",
    )
