"""Terminals: attached execs with output buffers and cursors."""

__all__: list[str] = []
