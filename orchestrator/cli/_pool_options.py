"""The warm-pool options ``serve`` and ``mcp`` share, declared once so that their flags,
variables and help cannot drift apart."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator._core import DEFAULT_POOL_IDLE, DEFAULT_SERVE_POOL, MAX_POOL_SIZE

__all__ = ["DEFAULT_POOL_IDLE", "PoolIdleOption", "PoolOption"]

PoolOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=MAX_POOL_SIZE,
        envvar="SANDHOLD_POOL",
        show_default=False,
        help="Sessions of the default policy kept warm "
        f"(0: none; default {DEFAULT_SERVE_POOL}, none for a policy file).",
    ),
]
PoolIdleOption = Annotated[
    float,
    typer.Option(
        min=1.0,
        envvar="SANDHOLD_POOL_IDLE",
        help="Seconds without a session taken from the pool after which it drains to zero; "
        "the next take fills it again.",
    ),
]
