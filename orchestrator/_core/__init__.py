"""The session manager: owners, tenants, quotas, the warm pool, the reaper and the reconcile. Never
imports ``tools/``: the tool layer sits above it."""

__all__: list[str] = []
