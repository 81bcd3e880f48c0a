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


class RemoveArgs(ToolArgs):
    session_id: str = SESSION_ID
    path: str = PATH
    recursive: bool = Field(
        False, description="Remove a directory with everything in it (else only an empty one)."
    )


class RenameArgs(ToolArgs):
    session_id: str = SESSION_ID
    path: str = Field(description="The entry to move, under /workspace.")
    new_path: str = Field(description="Where it goes, under /workspace; its directory exists.")
    overwrite: bool = Field(False, description="Replace an entry already at new_path.")


class MakeDirArgs(ToolArgs):
    session_id: str = SESSION_ID
    path: str = PATH
    parents: bool = Field(True, description="Create missing parent directories too.")


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


async def _stat(orch: SessionManager, tenant: str | None, args: PathArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    return {"session_id": session.id, **(await session.files.stat(args.path)).model_dump()}


async def _exists(orch: SessionManager, tenant: str | None, args: PathArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    return {"session_id": session.id, **(await session.files.exists(args.path)).model_dump()}


async def _remove(orch: SessionManager, tenant: str | None, args: RemoveArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    result = await session.files.remove(args.path, recursive=args.recursive)
    return {"session_id": session.id, **result.model_dump()}


async def _rename(orch: SessionManager, tenant: str | None, args: RenameArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    result = await session.files.rename(args.path, args.new_path, overwrite=args.overwrite)
    return {"session_id": session.id, **result.model_dump()}


async def _make_dir(orch: SessionManager, tenant: str | None, args: MakeDirArgs) -> Fields:
    session = await orch.session(args.session_id, tenant=tenant)
    result = await session.files.make_dir(args.path, parents=args.parents)
    return {"session_id": session.id, **result.model_dump()}


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
    read_only_operations=frozenset({"read", "list", "stat", "exists", "download"}),
    idempotent=True,
    description="A session's files under /workspace.",
    operations={
        op.name: op
        for op in (
            Operation("write", "content or content_b64", FileWriteArgs, _write),
            Operation("read", "text, or base64 if binary", PathArgs, _read),
            Operation("list", "a directory", FileListArgs, _list),
            Operation("stat", "one entry", PathArgs, _stat),
            Operation("exists", "whether it exists", PathArgs, _exists),
            Operation("remove", "remove an entry", RemoveArgs, _remove),
            Operation("rename", "move to new_path", RenameArgs, _rename),
            Operation("make_dir", "make a directory", MakeDirArgs, _make_dir),
            Operation("upload", "extract a tar into path", UploadArgs, _upload),
            Operation("download", "path as a tar", PathArgs, _download),
        )
    },
)
