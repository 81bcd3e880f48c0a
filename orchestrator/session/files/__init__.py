"""Files in a session's writable roots: the helper exchange, archives in and out."""

__all__: list[str] = []
