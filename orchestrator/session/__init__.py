"""One session: its container and the parts that run in it (the REPL, terminals, the persistent
shell, processes, files)."""

__all__: list[str] = []
