"""The ``files`` tool: files of a session, confined to /workspace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from orchestrator.tools._base import Fields, Operation, Tool, ToolArgs

if TYPE_CHECKING:
    from orchestrator._core.manager import SessionManager

__all__ = ["FILES_TOOL"]

SESSION_ID = Field(description="The session whose files to use.")
PATH = Field(description="A path under /workspace (relative paths start there).")


class FileWriteArgs(ToolArgs):
    session_id: str = SESSION_ID
    path: str = PATH
    content: str | None = Field(None, description="Text to write (UTF-8).")
    content_b64: str | None = Field(None, description="Bytes to write, base64-encoded.")
    make_parents: bool = Field(True, description="Create missing parent directories.")


class PathArgs(ToolArgs):
    session_id: str = SESSION_ID
    path: str = PATH


class FileListArgs(ToolArgs):
    session_id: str = SESSION_ID
    path: str = Field(".", description="A directory under /workspace.")


class UploadArgs(ToolArgs):
    session_id: str = SESSION_ID
    path: str = Field(description="Directory under /workspace to extract the archive into.")
    tar_b64: str = Field(description="A tar archive (optionally gzip/bz2/xz), base64-encoded.")


async def _write(orch: SessionManager, tenant: str | None, args: FileWriteArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    result = await session.files.write(
        args.path,
        content=args.content,
        content_b64=args.content_b64,
        make_parents=args.make_parents,
    )
    return {"session_id": session.id, **result.model_dump()}


async def _read(orch: SessionManager, tenant: str | None, args: PathArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    return {"session_id": session.id, **(await session.files.read(args.path)).model_dump()}


async def _list(orch: SessionManager, tenant: str | None, args: FileListArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    return {"session_id": session.id, **(await session.files.list(args.path)).model_dump()}


async def _upload(orch: SessionManager, tenant: str | None, args: UploadArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    result = await session.files.upload(args.path, tar_b64=args.tar_b64)
    return {"session_id": session.id, **result.model_dump()}


async def _download(orch: SessionManager, tenant: str | None, args: PathArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    return {"session_id": session.id, **(await session.files.download(args.path)).model_dump()}


FILES_TOOL = Tool(
    name="files",
    title="Session files",
    read_only_operations=frozenset({"read", "list", "download"}),
    idempotent=True,
    description="Read and write a session's files under /workspace; archives in and out as tar.",
    operations={
        op.name: op
        for op in (
            Operation("write", "write a file (text or base64)", FileWriteArgs, _write),
            Operation("read", "read a file (text, or base64 when binary)", PathArgs, _read),
            Operation("list", "entries of a directory", FileListArgs, _list),
            Operation("upload", "extract a tar archive into a directory", UploadArgs, _upload),
            Operation("download", "a file or directory as a tar archive", PathArgs, _download),
        )
    },
)
