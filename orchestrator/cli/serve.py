"""``sandhold serve``: the HTTP API (REST under /v1, OpenAPI, SSE) and MCP streamable HTTP at /mcp,
on one address, for the tenants of a tenants file or else one local tenant.

The port is bound before anything slow happens, so a taken port fails at once; then the image is
built if missing, the orchestrator started, ``--pool`` sessions of the default policy warmed
(2 unless told; ``--pool 0`` keeps none; drained after ``--pool-idle`` seconds without a take,
filled again at the next) with a progress display on stderr, and the address printed (with
the local tenant's key when it was just made: it is shown only that once, and kept mode 0600
in the data directory).

Stopping: the first Ctrl-C or SIGTERM stops accepting requests, lets those in flight finish
for ``GRACEFUL_SHUTDOWN_TIMEOUT``, then tears down every session this server created (shielded,
bounded by the orchestrator's shutdown timeout); a second one cuts the wait for requests short,
never the teardown. A signal before serving began cancels the start-up.

Reloading: SIGHUP reads the policies and the tenants file again, without dropping a session or a
connection: new sessions get the policies as they now are, live ones keep theirs; a key added
by ``sandhold tenant add`` works and one replaced by ``rotate`` stops working. A file that does
not validate is refused (logged, and printed on stdout) and the old settings stay.

Settings: ``--config FILE`` holds any of the options (``cli._serve_config``); an option given on
the command line or through its environment variable overrides the file.

Restarts: the registry (``--registry``, default ``registry.db`` in the data directory) records
every session, so a server started after a crash (``kill -9``) or a ``--keep-sessions`` stop
re-adopts the sessions it knew, their REPL state included, reaps every other container of its
orchestrator id, and prints what it did. Only one server uses a registry at a time.

Limits (``HttpLimitsConfig``; each has an option): a request head must arrive within
``--header-timeout``, an idle connection is closed after ``--keep-alive-timeout``, at most
``--max-connections`` are held (at most half the process's descriptors; the soft descriptor
limit is raised to the hard one at start) and ``--max-connections-per-client`` from one
address, ``--auth-failures-per-minute`` wrong keys per address are answered 401 (then 429), and
a tenant holds at most ``--max-streams-per-tenant`` event streams. Logs are rate-limited per
kind of message. ``--log-format json`` writes one JSON event a line (``cli._logging``); REST
answers carry ``X-Sandhold-Call-Id``, the id of the call in the audit log and the log.

Environment: the ``SANDHOLD_*`` settings of ``OrchestratorConfig.from_env`` (``SANDHOLD_IMAGE``,
``SANDHOLD_ORCHESTRATOR_ID``, ``SANDHOLD_EXTRA_LABELS``, ``SANDHOLD_REGISTRY``, ...; ``--policy``
wins over ``SANDHOLD_POLICY``), ``SANDHOLD_POOL`` for ``--pool``, ``SANDHOLD_POOL_IDLE`` for
``--pool-idle``, and ``SANDHOLD_DATA_DIR`` for the local key and the registry (else
``$XDG_DATA_HOME/sandhold``, else ``~/.local/share/sandhold``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from orchestrator._core import DEFAULT_MAX_SESSIONS
from orchestrator.cli._logging import LogFormat
from orchestrator.cli._pool_options import DEFAULT_POOL_IDLE, PoolIdleOption, PoolOption
from orchestrator.http import HttpLimitsConfig

__all__ = ["serve"]

_LIMITS = HttpLimitsConfig()  # the options' defaults
Backend = Literal["docker", "kubernetes"]


def serve(
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A TOML file of these options (host, port, policy, tenants, pool, data_dir, "
            "...; unknown keys refused); options given here override it.",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free one).")
    ] = 8080,
    e2b_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Also speak E2B's protocol (control API, envd, code interpreter) on this port, "
            "for E2B's SDKs (E2B_API_URL and E2B_SANDBOX_URL both http://HOST:PORT; docs/e2b.md).",
        ),
    ] = None,
    tenants: Annotated[
        Path | None,
        typer.Option(
            help="Tenants file (TOML: one tenant table per tenant, with name, key_sha256, and "
            "optionally policies and quotas; `sandhold tenant add` writes one); default: "
            "tenants.toml in the data directory if it exists, else one local tenant, its key "
            "kept in the data directory."
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(help="Default policy (name or file) for sessions a call names none for."),
    ] = None,
    pool: PoolOption = None,
    pool_idle: PoolIdleOption = DEFAULT_POOL_IDLE,
    max_sessions: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="SANDHOLD_MAX_SESSIONS",
            help="Sessions this server holds at most, all tenants together; at the limit a "
            "create ends the caller's own least recently active idle session, or is refused.",
        ),
    ] = DEFAULT_MAX_SESSIONS,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="SANDHOLD_DATA_DIR",
            help="The data directory (local key, registry, tenants.toml); default: "
            "$XDG_DATA_HOME/sandhold, else ~/.local/share/sandhold.",
        ),
    ] = None,
    registry: Annotated[
        Path | None,
        typer.Option(
            envvar="SANDHOLD_REGISTRY",
            help="The registry's SQLite file; default: registry.db in the data directory.",
        ),
    ] = None,
    keep_sessions: Annotated[
        bool,
        typer.Option(
            help="On a stop signal, leave the sessions running for the next start to re-adopt "
            "(default: destroy them)."
        ),
    ] = False,
    max_connections: Annotated[
        int, typer.Option(min=1, help="Connections held at once (at most half the descriptors).")
    ] = _LIMITS.max_connections,
    max_connections_per_client: Annotated[
        int, typer.Option(min=1, help="Connections held at once from one client address.")
    ] = _LIMITS.max_connections_per_client,
    header_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds a request head may take to arrive.")
    ] = _LIMITS.header_timeout,
    keep_alive_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds an idle connection is kept open.")
    ] = _LIMITS.keep_alive_timeout,
    auth_failures_per_minute: Annotated[
        int,
        typer.Option(min=1, help="Wrong API keys one address may present a minute; then 429."),
    ] = _LIMITS.auth_failures_per_minute,
    max_streams_per_tenant: Annotated[
        int, typer.Option(min=1, help="Event streams (SSE, GET /mcp) a tenant holds at once.")
    ] = _LIMITS.max_streams_per_tenant,
    backend: Annotated[
        Backend,
        typer.Option(
            envvar="SANDHOLD_BACKEND",
            help="The engine that runs the sessions: docker, or kubernetes (a Pod per session; "
            "docs/kubernetes.md).",
        ),
    ] = "docker",
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            help="Kubernetes: the kubeconfig file (default: $KUBECONFIG, else in-cluster "
            "configuration in a Pod, else ~/.kube/config).",
        ),
    ] = None,
    context: Annotated[
        str | None, typer.Option(help="Kubernetes: the kubeconfig context (default: current).")
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            help="Kubernetes: the namespace of the session Pods (default: the context's)."
        ),
    ] = None,
    runtime_class: Annotated[
        str | None,
        typer.Option(help="Kubernetes: the RuntimeClass of session Pods (gVisor, say)."),
    ] = None,
    seccomp_profile: Annotated[
        str | None,
        typer.Option(
            help="Kubernetes: localhost/<file> (sandhold's profile, placed on every node) or "
            "RuntimeDefault (the default)."
        ),
    ] = None,
    pod_pids_limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Kubernetes: the nodes' kubelet podPidsLimit; policies allowing fewer "
            "processes are refused (unset: every policy is, since pids cannot be enforced).",
        ),
    ] = None,
    network_isolated: Annotated[
        bool,
        typer.Option(
            "--network-isolated",
            help="Kubernetes: the Pods' network reaches nothing (an enforcing CNI and a deny-all "
            "NetworkPolicy): policies with network mode none may run.",
        ),
    ] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            help="Logs on stderr: text lines, or one JSON event a line (time, level, event, "
            "logger, session, tenant, call_id)."
        ),
    ] = "text",
) -> None:
    """Serve the sandbox tools over HTTP (REST, OpenAPI, SSE) and MCP until stopped."""
    import contextlib

    import anyio

    from orchestrator.cli._common import reported_errors
    from orchestrator.cli._logging import configure_logging
    from orchestrator.cli._serve_config import resolve_settings
    from orchestrator.cli._serving import plan_serving, serve_until_stopped

    with reported_errors():
        sources = {name: ctx.get_parameter_source(name) for name in ctx.params}
        settings = resolve_settings(config_file, ctx.params, sources)
    configure_logging(settings.log_format)
    with reported_errors():
        serving = plan_serving(settings)
        e2b_listener = serving.e2b_listener or contextlib.nullcontext()
        with serving.listener, e2b_listener:
            stopped_by = anyio.run(serve_until_stopped, serving)
    if stopped_by is not None:
        raise typer.Exit(128 + stopped_by)
