"""The python_repl side of a session: the worker protocol, the worker process and the interpreter
driver."""

__all__: list[str] = []
