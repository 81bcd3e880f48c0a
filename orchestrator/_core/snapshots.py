"""Snapshots of sessions: a session's filesystem, policy name, metadata and env, kept per tenant
in the registry, from which new sessions start (``session create`` with ``snapshot``, ``fork``).

What a snapshot keeps: the container's writable layer (committed to an image by the backend) and
the session's tmpfs roots (``/workspace``, the home directory, ``/tmp``), which no commit sees:
they are archived by ``tar`` run as the sandbox user, so the archive holds exactly what the
sandbox can read, and added to the image; a session made from it unpacks them, again as the
sandbox user, before its owner's first call. A REPL's memory is not kept (``REPL_STATE``): no
backend here can checkpoint a process (Docker's checkpoint needs CRIU and an engine in
experimental mode), so a session made from a snapshot starts a fresh interpreter, and every
answer says so.

Invariants: a snapshot id is visible to its tenant only (and, within it, as a session is, to its
task), and another tenant's id answers as an unknown one; a snapshot is counted against its
tenant's ``snapshots`` and ``snapshots_mb`` quotas (and ``MAX_SNAPSHOTS_PER_TENANT``) before it is
kept, and a refused one leaves no image; every snapshot image carries ``LABEL_SNAPSHOT`` and this
orchestrator's id, so ``sweep`` removes every image no registry row names (a crash mid-way, a row
deleted while a session still used its image).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from orchestrator._core.owners import current_task, may_see
from orchestrator._core.tenants import TenantConfig
from orchestrator.backend.base import (
    HOME,
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_ORCHESTRATOR,
    SNAPSHOT_FILES,
    STDERR,
    WORKSPACE,
    Backend,
    ExecSpec,
)
from orchestrator.errors import (
    InvalidArgumentError,
    NotSupportedError,
    OrchestratorError,
    QuotaExceededError,
    SessionNotFoundError,
)
from orchestrator.policy.arguments import check_id
from orchestrator.registry.store import Registry, SnapshotRecord
from orchestrator.session.session import Session

__all__ = [
    "KEEPS",
    "MAX_SNAPSHOTS_PER_TENANT",
    "REPL_STATE",
    "SNAPSHOT_REPOSITORY",
    "Snapshots",
]

log = logging.getLogger(__name__)

# A session made from a snapshot starts a fresh interpreter: no backend checkpoints a process.
REPL_STATE = "fresh"
KEEPS = ("filesystem", "policy", "metadata", "env")
SNAPSHOT_REPOSITORY = "sandhold-snapshot"
# 128 random bits, as a session id: a snapshot id is never guessable.
SNAPSHOT_ID_BYTES = 16
SNAPSHOT_PREFIX = "snap-"
# A bound whatever the tenant's quota says: each snapshot is an image the engine keeps.
MAX_SNAPSHOTS_PER_TENANT = 100
# Without a snapshots_mb quota an archive is still bounded: the tmpfs roots of the largest
# policy are far below this.
MAX_ARCHIVE_BYTES = 8 * 1024 * 1024 * 1024
# Archiving or unpacking the tmpfs roots runs at disk speed; past this the session is stuck.
ARCHIVE_TIMEOUT = 300.0
# tar's complaints (an unreadable file) are kept to say why; the rest is dropped.
MAX_STDERR_BYTES = 8 * 1024
# The images of deleted snapshots still in use by a session are looked for this often.
SWEEP_INTERVAL = 300.0
MIB = 1024 * 1024

# The tmpfs roots, relative to /, whose contents are archived (not the roots themselves: their
# owner and mode are the new session's own). sandhold's files in /tmp (the host lease, the
# worker's sockets) belong to the session they were made in; sockets cannot be archived.
ARCHIVE_SCRIPT = (
    "cd / && find {roots} -mindepth 1 ! -type s ! -path 'tmp/.sandhold*' -print0 "
    "| tar --null --no-recursion -T - -cf -"
).format(roots=" ".join(p.lstrip("/") for p in (WORKSPACE, HOME, "/tmp")))  # noqa: S108
# tar's status 1 is "a file changed as it was read" (a background process writing): kept.
ARCHIVE_OK = (0, 1)


def new_snapshot_id() -> str:
    return SNAPSHOT_PREFIX + secrets.token_hex(SNAPSHOT_ID_BYTES)


class Snapshots:
    """The snapshots of one orchestrator's tenants: take, find, list, delete, sweep."""

    def __init__(
        self,
        backend: Backend,
        *,
        registry: Callable[[], Registry],
        tenant_config: Callable[[str], TenantConfig | None],
        orchestrator_id: Callable[[], str],
        extra_labels: Mapping[str, str],
    ) -> None:
        self._backend = backend
        self._registry = registry
        self._tenant_config = tenant_config
        self._orchestrator_id = orchestrator_id
        self._extra_labels = dict(extra_labels)
        self._last_sweep = 0.0

    # -- taking ------------------------------------------------------------------------------

    async def take(self, session: Session, *, task: str | None) -> dict[str, Any]:
        """Snapshot ``session`` (the caller holds its turn, so no call of its owner runs)."""
        tenant = session.tenant
        kept = self._registry().snapshots(tenant)
        limits = self._tenant_config(tenant)
        quotas = limits.quotas if limits is not None else None
        most = MAX_SNAPSHOTS_PER_TENANT
        if quotas is not None and quotas.snapshots is not None:
            most = min(most, quotas.snapshots)
        if len(kept) >= most:
            raise QuotaExceededError(
                f"snapshots: the tenant keeps {len(kept)} of {most}",
                quota="snapshots",
                hint="delete_snapshot one it no longer needs",
            )
        used = sum(r.size_bytes for r in kept)
        budget = MAX_ARCHIVE_BYTES
        if quotas is not None and quotas.snapshots_mb is not None:
            budget = quotas.snapshots_mb * MIB - used
            if budget <= 0:
                raise self._over_size(used, quotas.snapshots_mb)
        snapshot_id = new_snapshot_id()
        reference = f"{SNAPSHOT_REPOSITORY}:{snapshot_id}"
        labels = {
            **self._extra_labels,
            LABEL_SNAPSHOT: snapshot_id,
            LABEL_SNAPSHOT_ORCHESTRATOR: self._orchestrator_id(),
        }
        workdir = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "sandhold-snap-"))
        try:
            archive = workdir / "files.tar"
            await self._archive(session, archive, budget)
            image = await self._backend.commit_container(
                session.container_id, reference=reference, labels=labels, files=archive
            )
        finally:
            await anyio.to_thread.run_sync(shutil.rmtree, workdir, True)
        record = SnapshotRecord(
            id=snapshot_id,
            tenant=tenant,
            task=task,
            policy=session.policy.name,
            image=image.reference,
            size_bytes=image.size_bytes,
            env=dict(session.env),
            metadata=dict(session.metadata),
            source_session=session.id,
            created_at=datetime.now(UTC).isoformat(),
        )
        try:
            cap = quotas.snapshots_mb if quotas is not None else None
            if cap is not None and used + image.size_bytes > cap * MIB:
                raise self._over_size(used + image.size_bytes, cap)
            self._registry().add_snapshot(record)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._backend.remove_image(image.reference)
            raise
        log.info(
            "session %s snapshotted as %s (%d bytes)", session.id, snapshot_id, record.size_bytes
        )
        return describe(record)

    @staticmethod
    def _over_size(used: int, quota_mb: int) -> QuotaExceededError:
        return QuotaExceededError(
            f"snapshots_mb: the tenant's snapshots would take {used / MIB:.1f} of {quota_mb} MiB",
            quota="snapshots_mb",
            hint="delete_snapshot one it no longer needs, or keep fewer files in the session",
        )

    async def _archive(self, session: Session, into: Path, budget: int) -> None:
        """The contents of the session's tmpfs roots, archived by tar as the sandbox user, into
        ``into``; more than ``budget`` bytes is the snapshots_mb quota's refusal."""
        stream = await self._backend.open_exec(
            session.container_id, ExecSpec(argv=["sh", "-c", ARCHIVE_SCRIPT], workdir="/")
        )
        written, errors, over = 0, bytearray(), False
        try:
            await stream.send_eof()
            with anyio.fail_after(ARCHIVE_TIMEOUT):
                async with await anyio.open_file(into, "wb") as out:
                    while (chunk := await stream.receive()) is not None:
                        kind, data = chunk
                        if kind == STDERR:
                            errors += data[: MAX_STDERR_BYTES - len(errors)]
                            continue
                        written += len(data)
                        if written > budget:
                            over = True
                            break
                        await out.write(data)
        finally:
            await stream.aclose()
        if over:
            raise QuotaExceededError(
                f"snapshots_mb: the session's files are larger than the {budget / MIB:.1f} MiB "
                "its tenant's snapshot quota leaves",
                quota="snapshots_mb",
                hint="delete_snapshot one it no longer needs, or keep fewer files in the session",
            )
        code = await self._backend.wait_exec_exit(stream.exec_id, timeout=ARCHIVE_TIMEOUT)
        complaint = errors.decode("utf-8", "replace").strip()
        if code not in ARCHIVE_OK or "find:" in complaint:
            raise InvalidArgumentError(
                f"the session's files could not all be read for its snapshot: {complaint[-500:]}",
                hint="make them readable by their owner (chmod u+r) and snapshot again",
            )

    # -- finding, restoring ---------------------------------------------------------------

    def find(self, snapshot_id: Any, tenant: str) -> SnapshotRecord:
        """The caller's snapshot; unknown and not-yours are indistinguishable."""
        check_id(snapshot_id, "snapshot")
        task = current_task()
        for record in self._registry().snapshots(tenant):
            if record.id == snapshot_id and may_see(record.task, task):
                return record
        raise SessionNotFoundError(f"snapshot not found: {snapshot_id}")

    def start_from(
        self, snapshot_id: Any, tenant: str, *, policy: Any, env: Any, metadata: Any
    ) -> tuple[str, dict[str, Any], dict[str, Any], str]:
        """What a session made from the caller's snapshot is given: its policy (``policy`` may
        only name it again), its env and metadata updated by those given, and its image. The
        policy is checked by the caller as for any new session (the tenant may no longer be
        allowed it, or it may no longer be loaded)."""
        record = self.find(snapshot_id, tenant)
        if policy is not None and policy != record.policy:
            raise InvalidArgumentError(
                f"snapshot {record.id} was taken under policy {record.policy!r}; a session "
                f"made from it has that policy, not {policy!r}"
            )
        for value, name in ((env, "env"), (metadata, "metadata")):
            if value is not None and not isinstance(value, dict):
                raise InvalidArgumentError(f"{name} must be a map of strings")
        return (
            record.policy,
            {**record.env, **(env or {})},
            {**record.metadata, **(metadata or {})},
            record.image,
        )

    async def unpack(self, session: Session) -> None:
        """Put the snapshot's files back into a session made from its image (as the sandbox
        user, before anything of its owner's runs in it)."""
        result = await self._backend.run(
            session.container_id,
            ExecSpec(argv=["tar", "-C", "/", "-xpf", SNAPSHOT_FILES], workdir="/"),
            timeout=ARCHIVE_TIMEOUT,
            max_output_bytes=MAX_STDERR_BYTES,
        )
        if result.exit_code != 0:
            complaint = result.stderr.decode("utf-8", "replace").strip()
            raise OrchestratorError(f"the snapshot's files could not be unpacked: {complaint}")

    # -- listing, deleting ----------------------------------------------------------------

    def listed(self, tenant: str) -> list[dict[str, Any]]:
        task = current_task()
        records = self._registry().snapshots(tenant)
        return [describe(r) for r in records if may_see(r.task, task)]

    async def delete(self, snapshot_id: Any, tenant: str) -> dict[str, Any]:
        """Forget the snapshot and remove its image; an image a session made from it still
        uses stays until a sweep after that session ends (``image_removed`` says which)."""
        record = self.find(snapshot_id, tenant)
        self._registry().remove_snapshot(record.id)
        removed = await self._backend.remove_image(record.image)
        log.info("snapshot %s deleted (image removed: %s)", record.id, removed)
        return {"snapshot_id": record.id, "deleted": True, "image_removed": removed}

    async def sweep(self) -> list[str]:
        """Remove this orchestrator's snapshot images that no registry row names and no
        container uses; the references removed. A backend that makes no images has none."""
        self._last_sweep = time.monotonic()
        try:
            images = await self._backend.list_images(
                [LABEL_SNAPSHOT, f"{LABEL_SNAPSHOT_ORCHESTRATOR}={self._orchestrator_id()}"]
            )
        except NotSupportedError:
            return []
        known = {r.image for r in self._registry().snapshots()}
        removed = []
        for image in images:
            if image.reference not in known and await self._backend.remove_image(image.reference):
                removed.append(image.reference)
        if removed:
            log.info("swept %d snapshot image(s) no snapshot names: %s", len(removed), removed)
        return removed

    async def sweep_if_due(self) -> None:
        """A sweep every ``SWEEP_INTERVAL`` (the reaper's rounds call this)."""
        if time.monotonic() - self._last_sweep >= SWEEP_INTERVAL:
            try:
                await self.sweep()
            except OrchestratorError as exc:
                log.warning("snapshot sweep skipped: %s", exc)

    async def at_shutdown(self, *, in_memory: bool) -> None:
        """The images of deleted snapshots that the sessions just ended still used go now; a
        registry ``in_memory`` (or claimed) goes with its process, and so do its snapshots."""
        if in_memory:
            await self.discard_all()
        else:
            await self.sweep()

    async def discard_all(self) -> None:
        """Delete every snapshot this registry keeps (a registry that goes with its process)."""
        for record in self._registry().snapshots():
            self._registry().remove_snapshot(record.id)
        await self.sweep()


def describe(record: SnapshotRecord) -> dict[str, Any]:
    """A snapshot as every interface answers it: never its env's values (they may be secrets),
    only their names."""
    return {
        "snapshot_id": record.id,
        "policy": record.policy,
        "source_session": record.source_session,
        "created_at": record.created_at,
        "size_bytes": record.size_bytes,
        "metadata": dict(record.metadata),
        "env_names": sorted(record.env),
        "keeps": list(KEEPS),
        "repl_state": REPL_STATE,
    }
