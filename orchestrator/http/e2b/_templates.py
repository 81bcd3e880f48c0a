"""E2B's template build API (``Template.build``, ``build_in_background``, ``get_build_status``,
``exists``, tags) onto sandhold's own template builds (``orchestrator.images``, docs/templates.md):
each build becomes a chain of sandhold user templates over a template this server has, built
with the network off, one image per layer, cached by the layer's inputs.

The SDK's flow and what answers it here:

1. ``POST /v3/templates`` ``{name, tags}``: a build is registered for the caller's tenant
   (``templateID``, ``buildID``); ``name:tag`` names a tag too.
2. ``GET /templates/{id}/files/{hash}``: whether the files of a ``copy`` are here; if not, an
   upload URL on this server (``PUT``, a one-time token in the path: the SDK sends no key with
   the upload), answered by ``upload`` with the tar's bytes, at most ``MAX_UPLOAD_BYTES``.
3. ``POST /v2/templates/{id}/builds/{build}`` ``{fromImage | fromTemplate, steps}``: the build
   starts in the background; it answers at once.
4. ``GET /templates/{id}/builds/{build}/status?logsOffset=N``: ``waiting``, ``building``,
   ``ready`` or ``error`` (with ``reason``), and the log entries from ``N`` on: what the build is
   doing, step by step, and the engine's output.
5. ``GET /templates/aliases/{name}``: 200 for a name of the caller's tenant with a finished
   build (``Template.exists``), else 404; tags: ``POST/DELETE /templates/tags``, ``GET
   /templates/{id}/tags``.

Steps: ``ENV``, ``WORKDIR``, ``USER`` and ``RUN`` (``run_cmd``, also ``user=``; ``make_symlink``
is a ``RUN ln -s``) become Dockerfile lines in the order given; ``COPY`` copies the uploaded
files; ``apt_install``'s command becomes a ``debs`` layer (Debian packages fetched on the host
and checked against apt's signed indexes, as for any sandhold template). Nothing is fetched from
inside a build: ``pip_install`` (unpinned, from an index) is refused with ``template_step`` and
a message pointing at sandhold's pinned ``pip`` templates. The parent: ``fromTemplate`` or
``fromImage`` naming a template this server has (``base``, E2B's ``e2bdev/base`` and
``code-interpreter-v1``, sandhold's template names, and builds of the same tenant); an image
sandhold does not have locally is refused (``image_not_found``): no image is ever pulled.
The image runs as the sandbox user (uid 10001) in ``/workspace`` whatever the steps set last,
as every sandhold session does.

Bounds, each with a stable ``error_type``: ``MAX_STEPS`` steps (``template_steps``), a step's
text (``template_step``), ``MAX_UPLOAD_BYTES`` per upload and ``MAX_UPLOADS_BYTES`` per tenant
(``template_files``), ``MAX_BUILDS`` builds kept per tenant (``quota_exceeded``), one build at
a time per tenant (``busy``), and a build's time (``TEMPLATE_BUILD_TIMEOUT``, ``timeout``).
State is this server's memory: builds, tags and uploads do not survive a restart (the images
do, and a rebuild of the same steps is a cache hit)."""

from __future__ import annotations

import asyncio
import bz2
import dataclasses
import datetime
import gzip
import hashlib
import io
import json
import logging
import lzma
import re
import secrets
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any, Final

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.errors import OrchestratorError
from orchestrator.http import CALLER_SCOPE_KEY, MAX_BODY_BYTES, Caller
from orchestrator.http.e2b._errors import e2b_error
from orchestrator.images.template_build import TEMPLATE_BUILD_TIMEOUT, ensure_template_image
from orchestrator.images.templates import BASE, MAX_CONTEXT_FILES, Template, TemplateCatalog

__all__ = ["UPLOAD_PREFIX", "TemplateBuilds", "upload_tenant"]

log = logging.getLogger(__name__)

MAX_STEPS: Final = 64
MAX_STEP_CHARS: Final = 16_384
# The front door's bound on any body (``MAX_BODY_BYTES``) is the upload's too.
MAX_UPLOAD_BYTES: Final = MAX_BODY_BYTES
MAX_UPLOADS_BYTES: Final = 256 * 1024 * 1024
# What one upload may unpack to: the engine unpacks it into the image being built, so a bomb (a
# small archive of a huge file) would fill the build's disk. Read to this bound, refused past it.
MAX_UNPACKED_BYTES: Final = 512 * 1024 * 1024
MAX_BUILDS: Final = 64
MAX_LOG_ENTRIES: Final = 2_000
# The SDK reads at most this many entries per poll (E2B's own page).
LOG_PAGE: Final = 100
UPLOAD_PREFIX: Final = "/_sandhold/template-files/"
NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
TAG: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_USER: Final = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$|^[0-9]{1,10}(:[0-9]{1,10})?$")
_HASH: Final = re.compile(r"^[0-9a-f]{64}$")
# E2B's names for what sandhold has: its base image is sandhold's base.
IMAGE_ALIASES: Final = {
    "e2bdev/base": BASE,
    "e2bdev/base:latest": BASE,
    "base": BASE,
    "code-interpreter-v1": "code-interpreter",
}
_APT: Final = re.compile(
    r"^apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install "
    r"-y (?:--no-install-recommends )?(?:--fix-missing )?(?P<packages>[a-z0-9][a-z0-9.+ -]*)$"
)
_PIP: Final = re.compile(r"^pip3? install\b")
_COPY_ROOT: Final = "/opt/sandhold-e2b-copy"  # in the image being built
# Docker's COPY of ``source`` (a path or a glob, relative to the upload) to ``target`` (relative
# to the working directory): a folder's contents, several matches or a target ending in "/" go
# into the target folder, one file becomes the target; then owner and mode, and the upload goes.
_COPY: Final = r"""set -e
root=$1 src=$2 dest=$3 owner=$4 mode=$5
case $dest in /*) ;; *) dest=$PWD/$dest ;; esac
cd "$root"
set -- $src
[ -e "$1" ] || [ -L "$1" ] || { echo "copy: $src matches nothing in the upload" >&2; exit 1; }
if [ $# -eq 1 ] && [ ! -d "$1" ] && [ "${dest%/}" = "$dest" ] && [ ! -d "$dest" ]; then
  mkdir -p "$(dirname "$dest")"; cp -a --no-preserve=ownership "$1" "$dest"
else
  mkdir -p "$dest"
  for m in "$@"; do
    if [ -d "$m" ] && [ ! -L "$m" ]; then cp -a --no-preserve=ownership "$m"/. "$dest"/
    else cp -a --no-preserve=ownership "$m" "$dest"/; fi
  done
fi
[ -z "$owner" ] || chown -R "$owner" "$dest"
[ -z "$mode" ] || chmod -R "$mode" "$dest"
rm -rf "$root"
"""
# The sandbox user every session runs as, and where it starts.
_SANDBOX_USER: Final = "10001:10001"
_WORKDIR: Final = "/workspace"


# Upload URLs given out and not used yet: token -> (tenant, files hash). The SDK's upload carries
# no key, so the token (unguessable, one use) is its credential at the front door.
_UPLOADS: dict[str, tuple[str, str]] = {}
MAX_PENDING_UPLOADS: Final = 10_000


def upload_tenant(path: str) -> str | None:
    """The tenant an upload URL of ``path`` was given to; None for any other path."""
    if not path.startswith(UPLOAD_PREFIX):
        return None
    found = _UPLOADS.get(path[len(UPLOAD_PREFIX) :])
    return found[0] if found else None


class BuildRefused(Exception):
    """A build request sandhold cannot honour; ``error_type`` says which bound or option. Not
    one of the error tree's: it never leaves this module but as E2B's 400 naming it."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


@dataclasses.dataclass
class Build:
    build_id: str
    status: str = "waiting"
    logs: list[dict[str, str]] = dataclasses.field(default_factory=list)
    reason: str | None = None
    step: str | None = None
    # The sandhold template of the last layer and its image, once ready.
    template: str | None = None
    image: str | None = None

    def say(self, message: str, level: str = "info") -> None:
        if len(self.logs) < MAX_LOG_ENTRIES:
            self.logs.append({"timestamp": _now(), "level": level, "message": message[:4000]})


@dataclasses.dataclass
class E2bTemplate:
    template_id: str
    tenant: str
    name: str
    builds: dict[str, Build] = dataclasses.field(default_factory=dict)
    tags: dict[str, str] = dataclasses.field(default_factory=dict)  # tag -> build id


class _BuildLog:
    """A sandhold build's progress as the E2B build's log entries."""

    def __init__(self, build: Build) -> None:
        self.build = build

    def step(self, name: str) -> None:
        self.build.say(f"[sandhold] {name}")

    def log(self, line: str) -> None:
        if line.strip():
            self.build.say(line.rstrip())

    def done(self, name: str) -> None:
        self.build.say(f"[sandhold] {name}: done")


@dataclasses.dataclass(frozen=True)
class Layer:
    """One sandhold template of a build's chain: Dockerfile lines over the uploads, or debs."""

    lines: tuple[str, ...] = ()
    debs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # upload hashes the lines copy from


def _quoted(value: str) -> str:
    return json.dumps(value)


def _one_line(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_STEP_CHARS:
        raise BuildRefused("template_step", f"{what} must be a non-empty string")
    if "\n" in value or "\r" in value:
        raise BuildRefused("template_step", f"{what} may not hold a line break")
    return value


def _user(value: Any) -> str:
    user = _one_line(value, "a user")
    if not _USER.match(user):
        raise BuildRefused("template_step", f"{user!r} is not a user name")
    return user


def plan_layers(steps: Any) -> list[Layer]:
    """E2B's build steps as sandhold layers (pure: nothing built). ``BuildRefused`` names the
    step and why."""
    if not isinstance(steps, list):
        raise BuildRefused("template_step", "steps must be a list")
    if len(steps) > MAX_STEPS:
        raise BuildRefused("template_steps", f"a build may have at most {MAX_STEPS} steps")
    layers: list[Layer] = []
    lines: list[str] = ["USER 0:0"]
    files: list[str] = []
    user = "0:0"

    def close() -> None:
        nonlocal lines, files
        if len(lines) > 1:
            layers.append(Layer(lines=tuple(lines), files=tuple(files)))
        lines, files = [f"USER {user}"], []

    for index, step in enumerate(steps, start=1):
        if not isinstance(step, dict):
            raise BuildRefused("template_step", f"step {index} is not an object")
        kind, args = step.get("type"), step.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise BuildRefused("template_step", f"step {index}: args must be strings")
        if kind == "RUN" and args:
            command = args[0]
            if len(command) > MAX_STEP_CHARS:
                raise BuildRefused("template_step", f"step {index}: the command is too long")
            if apt := _APT.match(command):
                close()
                layers.append(Layer(debs=tuple(apt.group("packages").split())))
                continue
            if _PIP.match(command):
                raise BuildRefused(
                    "template_step",
                    f"step {index}: {command[:80]!r} installs from an index, and sandhold builds "
                    "with the network off: name pinned wheels with hashes in a sandhold template "
                    "(docs/templates.md, pip = [...]) and build from it",
                )
            as_user = _user(args[1]) if len(args) > 1 and args[1] else None
            if as_user:
                lines.append(f"USER {as_user}")
            lines.append(f"RUN {json.dumps(['/bin/sh', '-c', command])}")
            if as_user:
                lines.append(f"USER {user}")
        elif kind == "ENV":
            if len(args) % 2:
                raise BuildRefused("template_step", f"step {index}: ENV takes name, value pairs")
            for name, value in zip(args[::2], args[1::2], strict=True):
                if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", name):
                    raise BuildRefused("template_step", f"step {index}: {name!r} is no name")
                lines.append(f"ENV {name}={_quoted(_one_line(value, 'an ENV value'))}")
        elif kind == "WORKDIR" and args:
            lines.append(f"WORKDIR {_quoted(_one_line(args[0], 'WORKDIR'))}")
        elif kind == "USER" and args:
            user = _user(args[0])
            lines.append(f"USER {user}")
        elif kind == "COPY" and len(args) >= 2:
            digest = step.get("filesHash")
            if not isinstance(digest, str) or not _HASH.match(digest):
                raise BuildRefused("template_step", f"step {index}: COPY without its files")
            source = _one_line(args[0], "a COPY source").lstrip("/")
            if ".." in Path(source).parts:
                raise BuildRefused("template_step", f"step {index}: {source!r} leaves the context")
            target = _one_line(args[1], "a COPY target")
            owner = _user(args[2]) if len(args) > 2 and args[2] else ""
            mode = args[3] if len(args) > 3 and args[3] else ""
            if mode and not re.match(r"^[0-7]{3,4}$", mode):
                raise BuildRefused("template_step", f"step {index}: {mode!r} is no mode")
            # The upload is added as the tar it is (the engine unpacks it in the image, links
            # as links), then copied as Docker's COPY would: as root, then back to the user.
            unpacked = f"{_COPY_ROOT}/{digest}"
            lines += [
                "USER 0:0",
                f"ADD {json.dumps([f'files/{digest}.tar', unpacked + '/'])}",
                "RUN " + json.dumps(["/bin/sh", "-c", _COPY, "copy", unpacked, source, target,
                                     owner, mode]),
                f"USER {user}",
            ]  # fmt: skip
            files.append(digest)
        else:
            raise BuildRefused(
                "template_step", f"step {index}: {kind!r} is not a step sandhold builds"
            )
    close()
    return layers


def _layer_templates(parent: str, layers: list[Layer], uploads: Path) -> list[Template]:
    """The chain of sandhold templates, named by their inputs (a name the catalog takes): the
    same steps over the same parent are the same template, whoever built them."""
    made: list[Template] = []
    for layer in layers:
        digest = hashlib.sha256(
            json.dumps([parent, layer.lines, layer.debs, layer.files]).encode()
        ).hexdigest()
        name = f"e2b-{digest[:24]}"
        if layer.debs:
            made.append(Template(name, "an E2B build's apt_install", parent, debs=layer.debs,
                                 shipped=False))  # fmt: skip
        else:
            context = uploads / "contexts" / name
            if not context.exists():
                (context / "files").mkdir(parents=True)
                for files_hash in layer.files:
                    upload = uploads / "tars" / f"{files_hash}.tar"
                    if upload.exists():
                        shutil.copyfile(upload, context / "files" / f"{files_hash}.tar")
            text = "ARG SANDHOLD_PARENT\nFROM ${SANDHOLD_PARENT}\n" + "\n".join(layer.lines)
            text += f"\nUSER {_SANDBOX_USER}\nWORKDIR {_WORKDIR}\n"
            made.append(Template(name, "an E2B build", parent, dockerfile=text.encode(),
                                 context=context, shipped=False))  # fmt: skip
        parent = name
    return made


class _Bounded(io.RawIOBase):
    """A stream read to at most ``limit`` bytes: past it, the upload is refused."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count: int = self._stream.readinto(buffer)
        self._left -= count
        if self._left < 0:
            raise BuildRefused(
                "template_files", f"the upload unpacks to more than {MAX_UNPACKED_BYTES} bytes"
            )
        return count


def _unpacking(data: bytes) -> Any:
    """The tar inside ``data``, decompressed as it is read (gzip, bzip2 and xz, which the
    engine's ``ADD`` unpacks too), or ``data`` itself."""
    raw = io.BytesIO(data)
    if data.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw)
    if data.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if data.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return raw


def _check_tar(data: bytes) -> None:
    """An upload is a tar (compressed or not) of files, folders and links with relative names
    that stay within it, at most ``MAX_CONTEXT_FILES`` entries, unpacking to at most
    ``MAX_UNPACKED_BYTES``: it is read through once, as a stream, and a bomb stops at that
    bound. Nothing is unpacked on this host: the engine unpacks it inside the image being built
    (``ADD``)."""
    bounded = _Bounded(_unpacking(data), MAX_UNPACKED_BYTES)
    try:
        with tarfile.open(fileobj=bounded, mode="r|") as archive:
            for count, member in enumerate(archive, start=1):
                _check_member(member, count)
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
        raise BuildRefused("template_files", f"the upload is not a tar archive: {exc}") from None


def _check_member(member: tarfile.TarInfo, count: int) -> None:
    if count > MAX_CONTEXT_FILES:
        raise BuildRefused("template_files", f"an upload holds at most {MAX_CONTEXT_FILES} files")
    plain = member.isfile() and not member.issparse()
    if not (plain or member.isdir() or member.issym() or member.islnk()):
        raise BuildRefused("template_files", f"{member.name!r}: not a file, folder or link")
    path = Path(member.name)
    if path.is_absolute() or ".." in path.parts:
        raise BuildRefused("template_files", f"{member.name!r} leaves the upload")


class TemplateBuilds:
    """The routes of E2B's build API and what they keep (per tenant, in memory)."""

    def __init__(self, orchestrator: Any) -> None:
        self.orchestrator = orchestrator
        self.templates: dict[str, E2bTemplate] = {}
        # Made on first use: a server that never builds leaves nothing behind.
        self._uploads: Path | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.upload_bytes: dict[str, int] = {}
        self.building: set[str] = set()  # tenants with a build running
        self.built: dict[str, Template] = {}  # layer templates made, by name

    def routes(self) -> list[Route]:
        return [
            Route("/v3/templates", self.request, methods=["POST"]),
            Route("/templates/aliases/{name}", self.alias, methods=["GET"]),
            Route("/templates/tags", self.assign_tags, methods=["POST"]),
            Route("/templates/tags", self.remove_tags, methods=["DELETE"]),
            Route("/templates/{template_id}/tags", self.tags, methods=["GET"]),
            Route("/templates/{template_id}/files/{files_hash}", self.file_link, methods=["GET"]),
            Route(UPLOAD_PREFIX + "{token}", self.upload, methods=["PUT"]),
            Route("/v2/templates/{template_id}/builds/{build_id}", self.start, methods=["POST"]),
            Route("/templates/{template_id}/builds/{build_id}/status", self.status,
                  methods=["GET"]),
        ]  # fmt: skip

    # -- helpers
    def _tenant(self, request: Request) -> str | None:
        caller = request.scope.get(CALLER_SCOPE_KEY)
        return caller.tenant if isinstance(caller, Caller) else None

    def _files_of(self, tenant: str) -> Path:
        """A tenant's uploads and build contexts: one tenant's files never serve another's
        build, nor does a files link tell one tenant what another uploaded."""
        if self._uploads is None:
            self._uploads = Path(tempfile.mkdtemp(prefix="sandhold-e2b-templates-"))
        return self._uploads / "tenants" / hashlib.sha256(tenant.encode()).hexdigest()[:16]

    def _named(self, tenant: str, name: str) -> E2bTemplate | None:
        for template in self.templates.values():
            if template.tenant == tenant and name in (template.name, template.template_id):
                return template
        return None

    def _ready(self, tenant: str, name: str) -> Build | None:
        """The ready build of ``tenant`` that ``name`` (its name or template id, ``:tag`` for
        a tag) names, or None: another tenant's names name nothing."""
        base, _, tag = name.partition(":")
        template = self._named(tenant, base)
        if template is None:
            return None
        build = template.builds.get(template.tags.get(tag or "default") or "")
        return build if build is not None and build.status == "ready" else None

    def template_for(self, tenant: str, name: str) -> str | None:
        """The sandhold template of the ready build ``name`` of ``tenant``, or None."""
        build = self._ready(tenant, name)
        return build.template if build is not None else None

    def image_for(self, tenant: str, name: str) -> str | None:
        """The image of the ready build ``name`` of ``tenant`` (``Sandbox.create``'s template),
        or None."""
        build = self._ready(tenant, name)
        return build.image if build is not None else None

    async def _body(self, request: Request) -> dict[str, Any] | Response:
        try:
            body = await request.json()
        except ValueError:
            return e2b_error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return e2b_error(400, "the body is not a JSON object")
        return body

    # -- routes
    async def request(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        raw, _, tag = str(body.get("name") or body.get("alias") or "").partition(":")
        tags = list(body.get("tags") or []) + ([tag] if tag else [])
        if not NAME.match(raw) or not all(isinstance(t, str) and TAG.match(t) for t in tags):
            return e2b_error(400, "template_name: a name is 1-64 of a-z 0-9 . _ - (tags alike)")
        template = self._named(tenant, raw)
        if template is None:
            if sum(t.tenant == tenant for t in self.templates.values()) >= MAX_BUILDS:
                return e2b_error(429, f"quota_exceeded: at most {MAX_BUILDS} templates")
            template = E2bTemplate("tpl_" + secrets.token_hex(10), tenant, raw)
            self.templates[template.template_id] = template
        if len(template.builds) >= MAX_BUILDS:
            return e2b_error(429, f"quota_exceeded: at most {MAX_BUILDS} builds of a template")
        build = Build(str(uuid.uuid4()))  # E2B's build ids are UUIDs
        template.builds[build.build_id] = build
        for name in tags or ["default"]:
            template.tags[name] = build.build_id
        return JSONResponse(
            {"templateID": template.template_id, "buildID": build.build_id, "public": False,
             "names": [raw], "aliases": [raw], "tags": tags or ["default"]},
            status_code=202,
        )  # fmt: skip

    async def alias(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        name = request.path_params["name"]
        shipped = IMAGE_ALIASES.get(name, name)
        if shipped in self.orchestrator.templates().templates and not shipped.startswith("e2b-"):
            return JSONResponse({"templateID": name, "public": True})  # one of this server's
        template = self._named(tenant, name)
        if template is None or not any(b.status == "ready" for b in template.builds.values()):
            return e2b_error(404, f"template '{name}' not found")
        return JSONResponse({"templateID": template.template_id, "public": False})

    async def file_link(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        files_hash = request.path_params["files_hash"]
        template = self.templates.get(request.path_params["template_id"])
        if template is None or template.tenant != tenant:
            return e2b_error(404, "template not found")
        if not _HASH.match(files_hash):
            return e2b_error(400, "template_files: a files hash is 64 hex digits")
        if (self._files_of(tenant) / "tars" / f"{files_hash}.tar").exists():
            return JSONResponse({"present": True}, status_code=201)
        if len(_UPLOADS) >= MAX_PENDING_UPLOADS:
            _UPLOADS.pop(next(iter(_UPLOADS)))  # the oldest link lapses
        token = secrets.token_urlsafe(24)
        _UPLOADS[token] = (tenant, files_hash)
        url = str(request.base_url).rstrip("/") + UPLOAD_PREFIX + token
        return JSONResponse({"present": False, "url": url}, status_code=201)

    async def upload(self, request: Request) -> Response:
        token = request.path_params["token"]
        found = _UPLOADS.pop(token, None)
        if found is None or found[0] != self._tenant(request):
            return e2b_error(404, "no such upload")
        tenant, files_hash = found
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_UPLOAD_BYTES:
                return e2b_error(
                    413, f"template_files: an upload is at most {MAX_UPLOAD_BYTES} bytes"
                )
        used = self.upload_bytes.get(tenant, 0) + len(data)
        if used > MAX_UPLOADS_BYTES:
            return e2b_error(
                413, f"template_files: a tenant's uploads total {MAX_UPLOADS_BYTES} bytes"
            )
        try:
            await anyio.to_thread.run_sync(_check_tar, bytes(data))
        except BuildRefused as exc:
            return e2b_error(400, f"{exc.error_type}: {exc}")
        target = self._files_of(tenant) / "tars" / f"{files_hash}.tar"
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_suffix(f".{secrets.token_hex(8)}")
        staging.write_bytes(data)
        staging.replace(target)  # whole or not at all
        self.upload_bytes[tenant] = used
        return Response(status_code=200)

    async def start(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        template = self.templates.get(request.path_params["template_id"])
        build = template.builds.get(request.path_params["build_id"]) if template else None
        if template is None or template.tenant != tenant or build is None:
            return e2b_error(404, "build not found")
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        if build.status != "waiting":
            return e2b_error(409, "busy: this build has started already")
        try:
            parent = self._parent(tenant, body)
            if body.get("startCmd") or body.get("readyCmd"):
                raise BuildRefused(
                    "not_supported",
                    "a start or ready command is not supported by sandhold: a sandbox runs "
                    "sandhold's worker; start a process with commands.run(background=True)",
                )
            if body.get("fromImageRegistry"):
                raise BuildRefused("image_not_found", "sandhold pulls no image from a registry")
            layers = plan_layers(body.get("steps") or [])
            tars = self._files_of(tenant) / "tars"
            for digest in (d for layer in layers for d in layer.files):
                if not (tars / f"{digest}.tar").exists():
                    raise BuildRefused(
                        "template_files",
                        f"the files of a copy ({digest[:12]}...) were not uploaded",
                    )
        except BuildRefused as exc:
            build.status, build.reason = "error", f"{exc.error_type}: {exc}"
            build.say(build.reason, "error")
            return e2b_error(400, build.reason)
        if tenant in self.building:
            build.status, build.reason = "error", "busy: another build of yours is running"
            return e2b_error(429, build.reason)
        self.building.add(tenant)
        build.status = "building"
        build.say(f"[sandhold] building {template.name} over {parent}: {len(layers)} layer(s)")
        task = asyncio.get_running_loop().create_task(self._run(tenant, build, parent, layers))
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)
        return Response(status_code=202)

    def _parent(self, tenant: str, body: dict[str, Any]) -> str:
        wanted = body.get("fromTemplate") or body.get("fromImage")
        if not isinstance(wanted, str) or not wanted:
            raise BuildRefused("template_step", "fromImage or fromTemplate is required")
        name = IMAGE_ALIASES.get(wanted, wanted)
        mine = self.template_for(tenant, name)
        if mine is not None:
            return mine
        catalog: TemplateCatalog = self.orchestrator.templates()
        if name in catalog.templates and not name.startswith("e2b-"):
            return name
        raise BuildRefused(
            "image_not_found",
            f"{wanted!r} is not an image or template on this server, and sandhold pulls no "
            f"images: build from one of {', '.join(sorted({*IMAGE_ALIASES, *catalog.names()}))} "
            "or a template of yours",
        )

    async def _run(self, tenant: str, build: Build, parent: str, layers: list[Layer]) -> None:
        try:
            chain = await anyio.to_thread.run_sync(
                _layer_templates, parent, layers, self._files_of(tenant)
            )
            for layer in chain:
                self.built[layer.name] = layer
            catalog: TemplateCatalog = self.orchestrator.templates()
            known = TemplateCatalog({**catalog.templates, **self.built})
            final = chain[-1].name if chain else parent
            base_tag = await self.orchestrator._images.image_for(BASE)
            with anyio.fail_after(TEMPLATE_BUILD_TIMEOUT):
                image = await ensure_template_image(
                    self.orchestrator.backend.client, known, final, base_tag=base_tag,
                    progress=_BuildLog(build),
                )  # fmt: skip
        except TimeoutError:
            build.status, build.reason = "error", f"timeout: past {TEMPLATE_BUILD_TIMEOUT:.0f} s"
        except OrchestratorError as exc:
            kind = getattr(exc, "error_type", "template_build")
            build.status, build.reason = "error", f"{kind}: {exc}"
        except Exception as exc:  # the engine's failure, whatever it is, is the build's answer
            build.status, build.reason = "error", f"template_build: {exc}"
        else:
            build.template, build.image = final, image.tag
            build.status = "ready"
            build.say(f"[sandhold] {image.tag} ready")
        finally:
            self.building.discard(tenant)
        if build.reason:
            build.say(build.reason, "error")
            log.info("e2b template build %s failed: %s", build.build_id, build.reason)

    async def status(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        template = self.templates.get(request.path_params["template_id"])
        build = template.builds.get(request.path_params["build_id"]) if template else None
        if template is None or template.tenant != tenant or build is None:
            return e2b_error(404, "build not found")
        raw = request.query_params.get("logsOffset") or "0"
        offset = int(raw) if raw.isascii() and raw.isdigit() else 0
        entries = build.logs[offset : offset + LOG_PAGE]
        body: dict[str, Any] = {
            "templateID": template.template_id, "buildID": build.build_id,
            "status": build.status, "logEntries": entries,
            "logs": [entry["message"] for entry in entries],
        }  # fmt: skip
        if build.status == "error":
            body["reason"] = {"message": build.reason or "the build failed"}
        return JSONResponse(body)

    async def assign_tags(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        name, _, source = str(body.get("target") or "").partition(":")
        tags = body.get("tags")
        template = self._named(tenant, name)
        if template is None:
            return e2b_error(404, f"template '{name}' not found")
        if not isinstance(tags, list) or not all(isinstance(t, str) and TAG.match(t) for t in tags):
            return e2b_error(400, "tags must be a list of tag names")
        build_id = template.tags.get(source or "default")
        if build_id is None:
            return e2b_error(404, f"tag '{source}' not found")
        for tag in tags:
            template.tags[tag] = build_id
        return JSONResponse({"buildID": build_id, "tags": tags}, status_code=201)

    async def remove_tags(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        template = self._named(tenant, str(body.get("name") or ""))
        if template is None:
            return e2b_error(404, "template not found")
        for tag in body.get("tags") or []:
            template.tags.pop(str(tag), None)
        return Response(status_code=204)

    async def tags(self, request: Request) -> Response:
        tenant = self._tenant(request)
        if tenant is None:
            return e2b_error(401, "Invalid API key")
        template = self._named(tenant, request.path_params["template_id"])
        if template is None:
            return e2b_error(404, "template not found")
        return JSONResponse(
            [{"tag": tag, "buildID": build_id, "createdAt": _now()}
             for tag, build_id in sorted(template.tags.items())]
        )  # fmt: skip
