"""The Docker Engine backend: session containers, execs, archives and stats.

Every SDK call goes through ``DockerClient.call`` (a thread under a limiter, errors translated);
only the attached exec streams are driven directly, see ``_attach``. A container is removed on
every path that fails after it was created, so a failed create never leaks one.
"""

from __future__ import annotations

import io
import json
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator.backend.base import (
    LABEL_SESSION,
    SANDBOX_UID,
    ContainerSpec,
    ContainerState,
    ContainerSummary,
    ExecResult,
    ExecSpec,
    SnapshotImage,
    check_exec_spec,
    run_to_completion,
)
from orchestrator.backend.docker._attach import AttachedExec
from orchestrator.backend.docker._client import DockerClient, NotFoundError
from orchestrator.backend.docker._egress import (
    LABEL_EGRESS_SESSION,
    PROXY_ALLOW,
    PROXY_CONTROL,
    PROXY_FINAL,
    PROXY_LOG,
    PROXY_PORT,
    PROXY_REFUSE,
    PROXY_STATS,
    EgressSettings,
    open_egress,
    reap_egress,
    remove_egress,
)
from orchestrator.backend.docker._snapshot import (
    commit_snapshot,
    list_snapshot_images,
    remove_snapshot_image,
)
from orchestrator.backend.docker._spec import FIXED_ENV, create_kwargs, egress_runtimes
from orchestrator.backend.network_log import EgressCounters, parse_counters, parse_log
from orchestrator.errors import BackendError, BackendUnavailableError, InvalidArgumentError

# Reading the proxy's log is one exec of cat on a tmpfs file of a few hundred KiB at most.
NETWORK_LOG_TIMEOUT = 10.0
NETWORK_LOG_MAX_BYTES = 1024 * 1024
# The proxy answers its final totals at once (a few counters in memory); a proxy slower than
# this is stuck, and the file it last wrote is read instead.
FINAL_READ_WAIT = 3.0
# Removing a running container is a SIGKILL plus cleanup; past this the engine is in trouble.
REMOVE_TIMEOUT = 30.0
# A proxy is a Python interpreter binding one port: well under a second on an idle machine; this
# leaves room for a loaded one before the creation is called a failure.
PROXY_READY_TIMEOUT = 15.0
# Run inside the proxy's container: connect to its port until it answers or the time is up.
_PROXY_READY = (
    "import socket, sys, time\n"
    "deadline = time.monotonic() + float(sys.argv[1])\n"
    "while True:\n"
    "    try:\n"
    f"        socket.create_connection(('127.0.0.1', {PROXY_PORT}), 1).close()\n"
    "        break\n"
    "    except OSError:\n"
    "        if time.monotonic() > deadline:\n"
    "            sys.exit(1)\n"
    "        time.sleep(0.02)\n"
)
_WRITE_WHOLE = (
    "import os, sys\n"
    "path = sys.argv[1]\n"
    "if len(sys.argv) < 3:\n"
    "    try:\n"
    "        os.remove(path)\n"
    "    except FileNotFoundError:\n"
    "        pass\n"
    "else:\n"
    "    open(path + '.new', 'w').write(sys.argv[2])\n"
    "    os.replace(path + '.new', path)\n"
)


class DockerBackend:
    """``Backend`` on a Docker Engine. ``client`` is the SDK wrapper, for the Docker-only callers
    (image builds, the tests of this backend); everyone else goes through the protocol."""

    def __init__(
        self, client: DockerClient | None = None, *, egress: EgressSettings | None = None
    ) -> None:
        self.client = client or DockerClient()
        self.egress = egress or EgressSettings()
        # Session id by container id, None for a session without egress: removing a container
        # also removes its proxy and network, and this saves an inspect to find them.
        self._egress_session: dict[str, str | None] = {}
        self._runtimes: frozenset[str] | None = None
        # Runtimes registered with ``--network=none`` (runsc often is): their containers have
        # no interface but loopback whatever network they join, so a session with egress runs
        # under the runtime's ``<name>-egress`` sibling (None: there is none).
        self._egress_runtime: dict[str, str | None] = {}
        # The streams this backend attached, by container: removing a container closes them,
        # since under runsc a removed container's exec streams can stay open for minutes.
        self._attached: weakref.WeakKeyDictionary[AttachedExec, str] = weakref.WeakKeyDictionary()

    async def runtimes(self) -> frozenset[str]:
        if self._runtimes is None:
            info = await self.client.call(lambda sdk: sdk.info())
            found = info.get("Runtimes") or {}
            self._runtimes = frozenset(found.keys())
            self._egress_runtime = egress_runtimes(found)
        return self._runtimes

    async def ping(self) -> None:
        await self.client.ping()

    async def create_container(self, spec: ContainerSpec) -> str:
        """Create and start a session container; on any failure nothing is left behind."""
        runtime: str | None = spec.policy.runtime
        if runtime is not None and runtime not in await self.runtimes():
            raise BackendUnavailableError(
                f"policy {spec.policy.name!r} asks for runtime {runtime!r}, "
                "which this Docker engine does not have",
                hint=f"install and register {runtime} with dockerd, or use another policy",
            )
        egress = None
        if spec.policy.network.mode != "none":
            if runtime is not None and runtime in self._egress_runtime:
                runtime = self._egress_runtime[runtime]
                if runtime is None:
                    raise BackendUnavailableError(
                        f"policy {spec.policy.name!r} has network mode "
                        f"{spec.policy.network.mode!r}, but this engine runs "
                        f"{spec.policy.runtime} with --network=none, which gives a container "
                        "no network to reach its proxy, and has no "
                        f"{spec.policy.runtime}-egress runtime to run it under instead",
                        hint="register a "
                        f"{spec.policy.runtime}-egress runtime with dockerd (.ci/install-runsc "
                        "does), or use network mode none",
                    )
            egress = await open_egress(self.client, spec, self.egress)
        try:
            kwargs = create_kwargs(spec, egress, runtime=runtime)
            container = await self.client.call(lambda sdk: sdk.containers.create(**kwargs))
        except BaseException:
            if egress is not None:
                with anyio.CancelScope(shield=True):
                    await remove_egress(self.client, spec.session_id)
            raise
        self._egress_session[str(container.id)] = spec.session_id if egress else None
        try:
            await self.client.call(lambda _sdk: container.start())
            if egress is not None:
                await self._wait_proxy_ready(egress.proxy_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.remove_container(container.id)
            raise
        return str(container.id)

    async def _wait_proxy_ready(self, proxy_id: str) -> None:
        """Until the proxy answers on its port: the session's first request must not meet a
        connection error. Waited after the session container started, so the two overlap."""
        result = await self.run(
            proxy_id,
            ExecSpec(
                argv=["python3", "-I", "-c", _PROXY_READY, str(PROXY_READY_TIMEOUT)], workdir="/"
            ),
            timeout=PROXY_READY_TIMEOUT + 5.0,
            max_output_bytes=4096,
        )
        if result.exit_code != 0:
            raise BackendError(
                f"the session's egress proxy did not answer within {PROXY_READY_TIMEOUT:.0f} s"
            )

    async def _egress_of(self, container_id: str) -> str | None:
        """The session id whose egress goes with this container, None when it has none."""
        if container_id in self._egress_session:
            return self._egress_session[container_id]
        try:
            info = await self.inspect(container_id)
        except NotFoundError:
            return None
        config = info.get("Config") or {}
        mode = (info.get("HostConfig") or {}).get("NetworkMode", "")
        session = (config.get("Labels") or {}).get(LABEL_SESSION)
        return session if session and mode.startswith("sandhold-egress-") else None

    async def network_log(self, container_id: str) -> list[dict[str, Any]]:
        """The session's egress attempts, oldest first, as the proxy recorded them (untrusted:
        each line is checked by ``session.network_log``); empty for a session without egress."""
        proxy = await self._proxy_of(container_id)
        if proxy is None:
            return []
        result = await self.run(
            proxy,
            ExecSpec(argv=["cat", PROXY_LOG], workdir="/"),
            timeout=NETWORK_LOG_TIMEOUT,
            max_output_bytes=NETWORK_LOG_MAX_BYTES,
        )
        return parse_log(result.stdout)

    async def set_egress_allow(self, container_id: str, allow: list[str]) -> None:
        """Replace the allowlist the session's proxy applies to new connections (checked
        against the policy by the caller). The file is written beside and renamed, so the
        proxy never reads half of it."""
        proxy = await self._proxy_of(container_id)
        if proxy is None:
            raise BackendError("the session has no egress proxy")
        if not await self._write_proxy_file(proxy, PROXY_ALLOW, json.dumps({"allow": allow})):
            raise BackendError("the egress proxy did not take the new allowlist")

    async def egress_counters(self, container_id: str) -> EgressCounters | None:
        """The totals of the session's proxy (untrusted, checked by ``parse_counters``); None
        for a session without egress or totals that do not read as the proxy's."""
        proxy = await self._proxy_of(container_id)
        if proxy is None:
            return None
        result = await self.run(
            proxy,
            ExecSpec(argv=["cat", PROXY_STATS], workdir="/"),
            timeout=NETWORK_LOG_TIMEOUT,
            max_output_bytes=64 * 1024,
        )
        return parse_counters(result.stdout)

    async def final_egress_counters(self, container_id: str) -> EgressCounters | None:
        """The session's last read of its proxy: the proxy ends its accounting (refuses every
        attempt, closes every connection) and answers its totals, which count every byte it
        moved. A proxy that does not answer (one started before it had a control socket) is
        read as ``egress_counters`` is."""
        proxy = await self._proxy_of(container_id)
        if proxy is None:
            return None
        result = await self.run(
            proxy,
            ExecSpec(
                argv=["python3", "-I", "-c", PROXY_FINAL, PROXY_CONTROL, str(FINAL_READ_WAIT)],
                workdir="/",
            ),
            timeout=NETWORK_LOG_TIMEOUT,
            max_output_bytes=64 * 1024,
        )
        if result.exit_code != 0:
            return await self.egress_counters(container_id)
        return parse_counters(result.stdout)

    async def set_egress_refusal(self, container_id: str, rule: str | None) -> None:
        """Make the session's proxy refuse every new attempt with ``rule`` and close its open
        connections (None: lift a refusal); the same exec-written file as the allowlist."""
        proxy = await self._proxy_of(container_id)
        if proxy is None:
            raise BackendError("the session has no egress proxy")
        text = None if rule is None else json.dumps({"rule": rule})
        if not await self._write_proxy_file(proxy, PROXY_REFUSE, text):
            raise BackendError("the egress proxy did not take the refusal")

    async def _write_proxy_file(self, proxy: str, path: str, text: str | None) -> bool:
        """Write ``text`` whole to ``path`` in the proxy's container (beside, then renamed, so
        the proxy never reads half of it), or remove it for None."""
        argv = ["python3", "-I", "-c", _WRITE_WHOLE, path, *([] if text is None else [text])]
        result = await self.run(
            proxy,
            ExecSpec(argv=argv, workdir="/"),
            timeout=NETWORK_LOG_TIMEOUT,
            max_output_bytes=4096,
        )
        return result.exit_code == 0

    async def _proxy_of(self, container_id: str) -> str | None:
        session = await self._egress_of(container_id)
        if session is None:
            return None
        proxies = await self.list_containers_by([f"{LABEL_EGRESS_SESSION}={session}"])
        return proxies[0] if proxies else None

    async def list_containers_by(self, labels: list[str]) -> list[str]:
        filters = {"label": labels}
        found = await self.client.call(
            lambda sdk: sdk.api.containers(all=True, quiet=True, filters=filters)
        )
        return [str(entry["Id"]) for entry in found]

    async def reap_egress(self, orchestrator_id: str, keep: set[str]) -> list[str]:
        """Remove egress proxies and networks whose session container is gone."""
        return await reap_egress(self.client, orchestrator_id, keep)

    async def remove_container(self, container_id: str) -> None:
        """Force-remove; a container that is already gone is not an error."""

        def remove(sdk: Any) -> None:
            try:
                sdk.api.remove_container(container_id, force=True, v=True)
            except Exception as exc:
                if getattr(exc, "status_code", None) in (404, 409):
                    return  # gone already, or removal already in progress
                raise

        session = await self._egress_of(container_id)
        with anyio.fail_after(REMOVE_TIMEOUT):
            await self.client.call(remove)
        if session is not None:
            await remove_egress(self.client, session)
        self._egress_session.pop(container_id, None)
        for stream, of in list(self._attached.items()):
            if of == container_id:
                await stream.aclose()

    async def container_state(self, container_id: str) -> ContainerState:
        data = await self.client.call(lambda sdk: sdk.api.inspect_container(container_id))
        state = data.get("State") or {}
        return ContainerState(
            status=str(state.get("Status", "unknown")),
            running=bool(state.get("Running")),
            oom_killed=bool(state.get("OOMKilled")),
            exit_code=state.get("ExitCode") if not state.get("Running") else None,
            pid=state.get("Pid") or None,
        )

    async def pause(self, container_id: str) -> None:
        """Freeze every process of the container (cgroup freezer). A freeze the runtime gave up
        on (``unable to freeze``: a process would not stop in time, seen on a loaded host) is
        thawed back by runc, so the container runs on: ``backend_unavailable``, try again."""
        try:
            await self.client.call(lambda sdk: sdk.api.pause(container_id))
        except BackendError as exc:
            if type(exc) is not BackendError or "unable to freeze" not in str(exc):
                raise
            raise BackendUnavailableError(
                f"the engine could not freeze the container, which runs on; try again ({exc})"
            ) from exc

    async def unpause(self, container_id: str) -> None:
        await self.client.call(lambda sdk: sdk.api.unpause(container_id))

    async def inspect(self, container_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.client.call(
            lambda sdk: sdk.api.inspect_container(container_id)
        )
        return result

    async def list_containers(self, labels: Mapping[str, str]) -> list[str]:
        filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
        found = await self.client.call(
            lambda sdk: sdk.api.containers(all=True, quiet=True, filters=filters)
        )
        return [str(entry["Id"]) for entry in found]

    async def describe_containers(self, labels: Sequence[str]) -> list[ContainerSummary]:
        """Containers carrying every label filter (``key`` or ``key=value``), as the engine lists
        them: id, labels, state, creation time."""
        filters = {"label": list(labels)}
        found = await self.client.call(lambda sdk: sdk.api.containers(all=True, filters=filters))
        return [
            ContainerSummary(
                id=str(entry["Id"]),
                labels=dict(entry.get("Labels") or {}),
                state=str(entry.get("State", "unknown")),
                created=float(entry.get("Created", 0)),
            )
            for entry in found
        ]

    async def commit_container(
        self,
        container_id: str,
        *,
        reference: str,
        labels: Mapping[str, str],
        files: Path | None = None,
    ) -> SnapshotImage:
        """``docker commit``, with ``files`` added through a helper container (``_snapshot``)."""
        return await commit_snapshot(
            self.client, container_id, reference=reference, labels=labels, files=files
        )

    async def remove_image(self, reference: str) -> bool:
        return await remove_snapshot_image(self.client, reference)

    async def list_images(self, labels: Sequence[str]) -> list[SnapshotImage]:
        return await list_snapshot_images(self.client, labels)

    async def open_exec(self, container_id: str, spec: ExecSpec) -> AttachedExec:
        check_exec_spec(spec)
        env = {**FIXED_ENV, **spec.env}
        created = await self.client.call(
            lambda sdk: sdk.api.exec_create(
                container_id,
                list(spec.argv),
                stdin=True,
                stdout=True,
                stderr=True,
                tty=spec.tty,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                environment=env,
                workdir=spec.workdir,
            )
        )
        endpoint = await self.client.endpoint()
        stream = await AttachedExec.start(endpoint, created["Id"], tty=spec.tty)
        self._attached[stream] = container_id
        return stream

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.client.call(lambda sdk: sdk.api.exec_inspect(exec_id))
        return result

    async def exec_exit_code(self, exec_id: str) -> int | None:
        """The exit code once the exec has ended, None while it runs."""
        info = await self.exec_inspect(exec_id)
        return None if info.get("Running") else info.get("ExitCode")

    async def exec_resize(self, exec_id: str, *, rows: int, cols: int) -> None:
        await self.client.call(lambda sdk: sdk.api.exec_resize(exec_id, height=rows, width=cols))

    async def run(
        self, container_id: str, spec: ExecSpec, *, timeout: float, max_output_bytes: int
    ) -> ExecResult:
        """Run to completion with stdin closed; output beyond the cap is counted, not kept."""
        return await run_to_completion(
            self, container_id, spec, timeout=timeout, max_output_bytes=max_output_bytes
        )

    async def wait_exec_exit(self, exec_id: str, *, timeout: float) -> int | None:
        """The exit code of an exec whose stream has ended; None if it is still running."""
        # The stream can end a moment before the engine records the exit code.
        with anyio.move_on_after(timeout):
            while (code := await self.exec_exit_code(exec_id)) is None:  # noqa: ASYNC110 (no exec-exit event)
                await anyio.sleep(0.01)
            return code
        return None

    async def oom_kills(self, container_id: str, *, since: float, until: float) -> int:
        """How many OOM kills the engine saw in the container between two wall-clock times."""

        def count(sdk: Any) -> int:
            events = sdk.api.events(
                since=f"{since:.9f}",
                until=f"{until:.9f}",
                filters={"container": container_id, "event": "oom"},
                decode=True,
            )
            try:
                return sum(1 for _ in events)
            finally:
                events.close()

        return await self.client.call(count)

    async def put_archive(self, container_id: str, path: str, tar_bytes: bytes) -> None:
        ok = await self.client.call(lambda sdk: sdk.api.put_archive(container_id, path, tar_bytes))
        if not ok:
            raise BackendError(f"engine refused the archive for {path}")

    async def get_archive(self, container_id: str, path: str, *, max_bytes: int) -> bytes:
        def fetch(sdk: Any) -> bytes:
            chunks, _stat = sdk.api.get_archive(container_id, path)
            buffer = io.BytesIO()
            for chunk in chunks:
                buffer.write(chunk)
                if buffer.tell() > max_bytes:
                    raise InvalidArgumentError(f"{path} is larger than {max_bytes} bytes")
            return buffer.getvalue()

        return await self.client.call(fetch)

    async def stats(self, container_id: str) -> dict[str, float]:
        raw = await self.client.call(
            lambda sdk: sdk.api.stats(container_id, stream=False, one_shot=True)
        )
        memory = raw.get("memory_stats") or {}
        pids = raw.get("pids_stats") or {}
        cpu = (raw.get("cpu_stats") or {}).get("cpu_usage") or {}
        return {
            "memory_bytes": float(memory.get("usage", 0)),
            "memory_limit_bytes": float(memory.get("limit", 0)),
            "pids": float(pids.get("current", 0)),
            "cpu_seconds": float(cpu.get("total_usage", 0)) / 1e9,
        }

    async def aclose(self) -> None:
        await self.client.aclose()


__all__ = ["DockerBackend", "NotFoundError"]
