"""What survives a restart: the SQLite registry, the reconcile plan, registries claimed side by
side, the fleet view."""

__all__: list[str] = []
