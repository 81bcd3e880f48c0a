"""The ``session`` tool: operations on a whole session beyond the four contract tools."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from orchestrator._core.session_control import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_BYTES,
)
from orchestrator._core.snapshots import REPL_STATE
from orchestrator.policy.arguments import check_policy_name
from orchestrator.tools._base import Fields, Operation, Tool, ToolArgs
from orchestrator.tools._env import SESSION_ENV

if TYPE_CHECKING:
    from orchestrator._core.manager import SessionManager

__all__ = ["SESSION_TOOL"]


class SessionArgs(ToolArgs):
    session_id: str = Field(description="The session.")


class CreateArgs(ToolArgs):
    policy: str | None = Field(
        None, description="Policy of the new session (default: the orchestrator's)."
    )
    env: dict[str, str] | None = Field(None, description=SESSION_ENV)
    metadata: dict[str, str] | None = Field(
        None,
        description=(
            f"Labels kept with the session and listed with it (list_sessions): at most "
            f"{MAX_METADATA_KEYS} keys of up to {MAX_METADATA_KEY_CHARS} characters, each "
            f"value up to {MAX_METADATA_VALUE_BYTES} bytes. Not for secrets: they are shown."
        ),
    )
    snapshot: str | None = Field(
        None,
        description="Start from this snapshot of yours (the operations snapshot and "
        "snapshots): its files, policy, env and metadata (env and metadata given here update "
        "its own); the REPL starts fresh.",
    )


class TimeoutArgs(ToolArgs):
    session_id: str = Field(description="The session.")
    timeout_s: float = Field(
        description="Seconds from now until the session ends; at most what its policy's "
        "timeouts.max_lifetime_s leaves of its lifetime (error_type policy beyond)."
    )


async def _create(orch: SessionManager, tenant: str | None, args: CreateArgs) -> Fields:
    policy = check_policy_name(args.policy)
    session = await orch.create_session(
        policy=policy, tenant=tenant, env=args.env, metadata=args.metadata, snapshot=args.snapshot
    )
    return {
        "session_id": session.id,
        "created_new_session": True,
        "policy": session.policy.name,
        "metadata": dict(session.metadata),
        "snapshot_id": args.snapshot,
        "repl_state": REPL_STATE,
    }


class ListSnapshotsArgs(ToolArgs):
    pass


class SnapshotIdArgs(ToolArgs):
    snapshot: str = Field(description="One of your snapshots (the operation snapshots lists them).")


async def _snapshot(orch: SessionManager, tenant: str | None, args: SessionArgs) -> Fields:
    return {"session_id": args.session_id, **await orch.snapshot(args.session_id, tenant=tenant)}


async def _fork(orch: SessionManager, tenant: str | None, args: SessionArgs) -> Fields:
    session = await orch.fork(args.session_id, tenant=tenant)
    return {
        "session_id": session.id,
        "source_session": args.session_id,
        "created_new_session": True,
        "policy": session.policy.name,
        "metadata": dict(session.metadata),
        "repl_state": REPL_STATE,
    }


async def _list_snapshots(
    orch: SessionManager, tenant: str | None, args: ListSnapshotsArgs
) -> Fields:
    return {"snapshots": orch.list_snapshots(tenant=tenant)}


async def _delete_snapshot(
    orch: SessionManager, tenant: str | None, args: SnapshotIdArgs
) -> Fields:
    return await orch.delete_snapshot(args.snapshot, tenant=tenant)


async def _set_timeout(orch: SessionManager, tenant: str | None, args: TimeoutArgs) -> Fields:
    ends = await orch.set_timeout(args.session_id, args.timeout_s, tenant=tenant)
    return {"session_id": args.session_id, **ends}


async def _metrics(orch: SessionManager, tenant: str | None, args: SessionArgs) -> Fields:
    figures = await orch.session_metrics(args.session_id, tenant=tenant)
    return {"session_id": args.session_id, **figures}


async def _pause(orch: SessionManager, tenant: str | None, args: SessionArgs) -> Fields:
    changed = await orch.pause(args.session_id, tenant=tenant)
    return {"session_id": args.session_id, "paused": True, "changed": changed}


async def _resume(orch: SessionManager, tenant: str | None, args: SessionArgs) -> Fields:
    changed = await orch.resume(args.session_id, tenant=tenant)
    return {"session_id": args.session_id, "paused": False, "changed": changed}


async def _network_log(orch: SessionManager, tenant: str | None, args: SessionArgs) -> Fields:
    entries = await orch.network_log(args.session_id, tenant=tenant)
    denied = sum(1 for entry in entries if entry["decision"] == "deny")
    return {"session_id": args.session_id, "entries": entries, "denied": denied}


class AllowlistArgs(ToolArgs):
    session_id: str = Field(description="The session.")
    allow: list[str] = Field(
        max_length=256,
        description="The new rules (as in a policy's `network.allow`), each within the "
        "session's policy; they replace the rules in force for new connections.",
    )


async def _set_allowlist(orch: SessionManager, tenant: str | None, args: AllowlistArgs) -> Fields:
    rules = await orch.set_allowlist(args.session_id, list(args.allow), tenant=tenant)
    return {"session_id": args.session_id, "allow": rules}


class ShareArgs(ToolArgs):
    terminal_id: str = Field(description="A terminal of the calling task.")
    task: str = Field(description="Another task of the same tenant, to receive the grant.")
    actions: list[Literal["read", "wait", "write", "interrupt", "kill"]] = Field(
        min_length=1, max_length=5, description="What the other task may do on the terminal."
    )


class CloseOwnerArgs(ToolArgs):
    task: str = Field(description="The task whose sessions and terminals end.")


async def _share(orch: SessionManager, tenant: str | None, args: ShareArgs) -> Fields:
    actions = await orch.share(args.terminal_id, args.task, list(args.actions), tenant=tenant)
    return {"terminal_id": args.terminal_id, "task": args.task, "actions": actions}


async def _close_owner(orch: SessionManager, tenant: str | None, args: CloseOwnerArgs) -> Fields:
    return await orch.close_owner(args.task, tenant=tenant)


SESSION_TOOL = Tool(
    name="session",
    title="Session control",
    description="Whole sessions and tasks: create, pause, lifetime, egress, sharing.",
    notes=(
        "`create` makes a session (with a policy, an env every process in it sees and metadata "
        "kept with it) without running anything; `pause` freezes every process of a session "
        "(its state and files kept); `resume` thaws it (any other call on a paused session "
        "does too). `set_timeout` ends the session timeout_s from now (sooner or later than "
        "planned, never past its policy's maximum lifetime); `metrics` answers its container's "
        "CPU and memory now. `network_log` lists the session's egress attempts (time, method, "
        "host, port, decision, rule, bytes each way), the newest 512 at most; `set_allowlist` "
        "replaces the rules its proxy applies to new connections, never wider than its "
        "policy's. `share` grants listed actions on one of your task's terminals to another "
        "task of your tenant; `close_owner` ends everything a task owns and closes the task. "
        "`snapshot` keeps a session's files (/workspace, home, /tmp and the rest of its "
        "filesystem), policy, env and metadata under a snapshot_id, counted against your "
        "snapshot quota and kept across restarts; `create` with snapshot starts a session from "
        "one, `fork` copies a session in one call (its snapshot goes with it); `snapshots` "
        "lists yours, `delete_snapshot` drops one. A REPL's memory is not kept: `repl_state` "
        "is fresh."
    ),
    operations={
        op.name: op
        for op in (
            Operation("create", "a new session", CreateArgs, _create),
            Operation("pause", "freeze until the next call", SessionArgs, _pause),
            Operation("resume", "thaw it", SessionArgs, _resume),
            Operation("set_timeout", "end it timeout_s from now", TimeoutArgs, _set_timeout),
            Operation("metrics", "CPU and memory", SessionArgs, _metrics),
            Operation("network_log", "its egress attempts", SessionArgs, _network_log),
            Operation(
                "set_allowlist",
                "narrow its egress rules",
                AllowlistArgs,
                _set_allowlist,
            ),
            Operation("share", "grant terminal actions", ShareArgs, _share),
            Operation("close_owner", "end a task", CloseOwnerArgs, _close_owner),
            Operation("snapshot", "save", SessionArgs, _snapshot),
            Operation("fork", "copy", SessionArgs, _fork),
            Operation("snapshots", "yours", ListSnapshotsArgs, _list_snapshots),
            Operation("delete_snapshot", "drop", SnapshotIdArgs, _delete_snapshot),
        )
    },
    read_only_operations=frozenset({"network_log", "metrics", "snapshots"}),
)
