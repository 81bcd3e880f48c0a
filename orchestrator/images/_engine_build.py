"""One image build on the engine from a prepared context folder, with the network off, its log
streamed into the build progress and its failure (an error chunk, or the bound passing) raised
as an ``ImageError`` carrying the last lines. Runs in a worker thread (``DockerClient.call``)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio.from_thread

from orchestrator.errors import ImageError
from orchestrator.images._process import TAIL_LINES
from orchestrator.images.progress import BuildProgress


def build_blocking(
    sdk: Any,
    *,
    context: Path,
    tag: str,
    buildargs: Mapping[str, str],
    labels: Mapping[str, str],
    progress: BuildProgress,
    timeout: float,
) -> None:
    """Build ``context/Dockerfile`` as ``tag``. ``network_mode="none"``: a RUN step that reaches
    for the network fails, so nothing but the context goes in."""
    stream = sdk.api.build(
        path=str(context),
        dockerfile="Dockerfile",
        tag=tag,
        buildargs=dict(buildargs),
        labels=dict(labels),
        network_mode="none",
        rm=True,
        forcerm=True,
        pull=False,
        decode=True,
        timeout=int(timeout),
    )
    follow(stream, tag, progress, timeout)


def follow(
    stream: Iterable[dict[str, Any]], tag: str, progress: BuildProgress, timeout: float
) -> None:
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    deadline = time.monotonic() + timeout
    for chunk in stream:
        for line in str(chunk.get("stream", "")).splitlines():
            if line.strip():
                tail.append(line.rstrip())
                anyio.from_thread.run_sync(progress.log, line.rstrip())
        if "error" in chunk:
            raise ImageError(
                f"building {tag} failed: {str(chunk['error']).strip()}",
                hint="last build lines: " + " | ".join(tail) if tail else None,
            )
        if time.monotonic() > deadline:
            raise ImageError(f"building {tag} took longer than {timeout:.0f} s")
