"""Templates: named sandbox images a policy selects (``[image] template = "python-data"``).

``base`` is the worker image itself (``ensure_worker_image``). Every other template is a TOML
file naming the template it builds on (``from``) and one way of adding to it:

* ``lock`` (a pinned requirements file beside it) or ``pip`` (the same pins inline): wheels
  downloaded on the host, hash-checked, installed in a build with the network off;
* ``dockerfile``: a Dockerfile whose only ``FROM`` is ``${SANDHOLD_PARENT}`` (the parent's image),
  built with the network off, with ``context`` (a folder beside the file) as its build context;
* ``debs``: Debian packages, resolved against the parent image and fetched on the host with the
  dependencies it lacks, installed by dpkg in a build with the network off (template_debs.py).

Shipped templates live in ``images/templates``; a user's in the template directories
(``<data dir>/templates`` by default), one ``NAME.toml`` each, and may not reuse a shipped name.
Pure: reading and checking files, nothing built here.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from orchestrator._resources import shipped_templates_dir
from orchestrator.errors import TemplateFileError, UnknownTemplateError
from orchestrator.images.lockfile import LockError, Pin, parse_lock

__all__ = [
    "BASE",
    "Template",
    "TemplateCatalog",
    "load_catalog",
    "load_template_file",
]

BASE = "base"
TEMPLATE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
TemplateName = Annotated[str, StringConstraints(pattern=TEMPLATE_NAME.pattern)]
ModuleName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
]
# Debian package names (Debian Policy 5.6.1).
DebName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.+-]{1,63}$")]
# Values go into a Dockerfile's ENV line: a plain character set needs no quoting to be exact.
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Z_][A-Z0-9_]{0,63}$")]
EnvValue = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./:,=@+-]{0,256}$")]
# Set by the container spec, the worker or the shell: a template may not change them.
RESERVED_ENV = frozenset({"HOME", "PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH"})
# The only parent a user Dockerfile may start from, passed as a build argument.
PARENT_ARG = "SANDHOLD_PARENT"
_FROM_PARENT = re.compile(r"^FROM\s+\$\{?" + PARENT_ARG + r"\}?\s*$", re.IGNORECASE)
# A build context is copied to the engine and hashed: a template's folder, not a disk.
MAX_CONTEXT_BYTES = 256 * 1024 * 1024
MAX_CONTEXT_FILES = 2000
MAX_PARENT_DEPTH = 8


class TemplateFile(BaseModel):
    """The keys of a template's TOML file."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    description: str = Field("", max_length=500)
    parent: TemplateName = Field(BASE, alias="from")
    # For people and the lock tool: what the lock was resolved from.
    packages: tuple[str, ...] = ()
    lock: str | None = None
    pip: tuple[str, ...] = ()
    dockerfile: str | None = None
    context: str | None = None
    debs: tuple[DebName, ...] = Field((), max_length=32)
    preload: tuple[ModuleName, ...] = Field((), max_length=64)
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=64)


@dataclass(frozen=True)
class Template:
    """A template as the build and the manager use it. ``pins`` empty and ``dockerfile`` None
    only for ``base``; a user template has one or the other."""

    name: str
    description: str
    parent: str | None
    pins: tuple[Pin, ...] = ()
    dockerfile: bytes | None = None
    context: Path | None = None
    debs: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    source: Path | None = None
    shipped: bool = True


BASE_TEMPLATE = Template(
    name=BASE,
    description="The worker image: Python, the REPL worker and psutil.",
    parent=None,
)


@dataclass(frozen=True)
class TemplateCatalog:
    """Every template this orchestrator knows, by name."""

    templates: Mapping[str, Template]

    def names(self) -> list[str]:
        return sorted(self.templates)

    def get(self, name: str) -> Template:
        try:
            return self.templates[name]
        except KeyError:
            raise UnknownTemplateError(name, self.names()) from None

    def chain(self, name: str) -> list[Template]:
        """``name``'s template and its parents, nearest first, ending at ``base``."""
        found = [self.get(name)]
        while found[-1].parent is not None:
            found.append(self.get(found[-1].parent))
        return found


def load_catalog(user_dirs: Sequence[Path] = ()) -> TemplateCatalog:
    """The shipped templates and every ``*.toml`` of ``user_dirs`` (a missing folder is none),
    each parent known and no chain looping or deeper than ``MAX_PARENT_DEPTH``."""
    templates: dict[str, Template] = {BASE: BASE_TEMPLATE}
    for path in sorted(shipped_templates_dir().glob("*.toml")):
        templates[path.stem] = load_template_file(path, shipped=True)
    for directory in user_dirs:
        for path in sorted(directory.glob("*.toml")) if directory.is_dir() else ():
            if path.stem in templates:
                where = "shipped" if templates[path.stem].shipped else "another directory"
                raise TemplateFileError(str(path), "-", f"{path.stem!r} is already {where}")
            templates[path.stem] = load_template_file(path, shipped=False)
    _check_parents(templates)
    return TemplateCatalog(templates)


def _check_parents(templates: Mapping[str, Template]) -> None:
    for template in templates.values():
        seen = [template.name]
        current = template
        while current.parent is not None:
            if current.parent not in templates:
                raise TemplateFileError(
                    str(current.source), "from", f"no template {current.parent!r}"
                )
            if current.parent in seen or len(seen) > MAX_PARENT_DEPTH:
                chain = " -> ".join([*seen, current.parent])
                raise TemplateFileError(str(template.source), "from", f"cycle or too deep: {chain}")
            seen.append(current.parent)
            current = templates[current.parent]


def load_template_file(path: Path, *, shipped: bool) -> Template:
    name = path.stem
    if not TEMPLATE_NAME.match(name) or name == BASE:
        raise TemplateFileError(
            str(path), "name", f"{name!r}: a template name is [a-z][a-z0-9-]*, at most 40, not base"
        )
    raw = _read_toml(path)
    try:
        data = TemplateFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        problem = exc.errors()[0]
        key = ".".join(str(part) for part in problem["loc"]) or "-"
        reason = "unknown key" if problem["type"] == "extra_forbidden" else problem["msg"]
        raise TemplateFileError(str(path), key, reason) from None
    if data.parent == name:
        raise TemplateFileError(str(path), "from", "a template cannot build on itself")
    if reserved := sorted(set(data.env) & RESERVED_ENV):
        raise TemplateFileError(str(path), "env", f"may not set {', '.join(reserved)}")
    ways = [key for key in ("lock", "pip", "dockerfile", "debs") if getattr(data, key)]
    if len(ways) != 1:
        raise TemplateFileError(
            str(path), "-", "give exactly one of lock, pip, dockerfile and debs (got "
            f"{', '.join(ways) or 'none'}); a template needing two builds on another"
        )  # fmt: skip
    if data.context is not None and data.dockerfile is None:
        raise TemplateFileError(str(path), "context", "only a dockerfile has a build context")
    return Template(
        name=name,
        description=data.description,
        parent=data.parent,
        pins=_pins(path, data),
        dockerfile=_dockerfile(path, data.dockerfile),
        context=_context(path, data.context),
        debs=data.debs,
        preload=data.preload,
        env=dict(sorted(data.env.items())),
        source=path,
        shipped=shipped,
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise TemplateFileError(str(path), "-", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TemplateFileError(str(path), "-", f"not valid TOML: {exc}") from None


def _beside(path: Path, relative: str, key: str) -> Path:
    """A file named by ``key``, which must stay in the template file's folder."""
    target = (path.parent / relative).resolve()
    if not target.is_relative_to(path.parent.resolve()):
        raise TemplateFileError(str(path), key, f"{relative!r} is outside the template's folder")
    return target


def _pins(path: Path, data: TemplateFile) -> tuple[Pin, ...]:
    if data.lock is not None:
        lock_path = _beside(path, data.lock, "lock")
        try:
            text, where, key = lock_path.read_text(encoding="utf-8"), str(lock_path), "-"
        except OSError as exc:
            raise TemplateFileError(str(lock_path), "-", f"cannot read: {exc.strerror}") from None
    elif data.pip:
        text, where, key = "\n".join(data.pip), str(path), "pip"
    else:
        return ()
    try:
        return parse_lock(text)
    except LockError as exc:
        raise TemplateFileError(where, key, str(exc)) from None


def _dockerfile(path: Path, relative: str | None) -> bytes | None:
    if relative is None:
        return None
    file = _beside(path, relative, "dockerfile")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateFileError(str(file), "-", f"cannot read: {exc}") from None
    check_dockerfile(text, str(file))
    return text.encode()


def check_dockerfile(text: str, where: str) -> None:
    """One ``FROM ${SANDHOLD_PARENT}``, after nothing but ``ARG`` lines and comments: a user's
    image starts from one of ours and from nothing else (nothing could be pulled anyway)."""
    instructions = [
        line.strip() for line in _joined(text) if line.strip() and not line.lstrip().startswith("#")
    ]
    froms = [line for line in instructions if line.split()[0].upper() == "FROM"]
    if len(froms) != 1 or not _FROM_PARENT.match(froms[0]):
        raise TemplateFileError(
            where, "FROM", f"needs exactly one FROM, and it is FROM ${{{PARENT_ARG}}}"
        )
    for line in instructions:
        if line.split()[0].upper() == "FROM":
            break
        if line.split()[0].upper() != "ARG":
            raise TemplateFileError(where, "FROM", "only ARG may come before FROM")


def _joined(text: str) -> Iterable[str]:
    pending = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _context(path: Path, relative: str | None) -> Path | None:
    if relative is None:
        return None
    folder = _beside(path, relative, "context")
    if not folder.is_dir():
        raise TemplateFileError(str(path), "context", f"{relative!r} is not a folder")
    return folder
