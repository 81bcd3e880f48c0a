"""The session manager: owners, tenants, quotas, the warm pool, the reaper and the reconcile. Never
imports ``tools/``: the tool layer sits above it.

This is its face: what the interfaces (``cli``, ``http``, ``mcp_server``) use of it, and all they
may use (``tests/unit/test_layers.py``): settings and their limits, the data directory, tenants
and their keys, the engine seam, the call context, metrics and readiness; the manager itself
they reach through ``Orchestrator``. Each name is imported on first use (PEP 562):
``sandhold --help`` and the quick commands import this face without the tenants, the engine or
the manager behind it.
"""

from typing import TYPE_CHECKING

from orchestrator._core.data_dir import TENANTS_FILE, data_dir, migrate_legacy_data_dir
from orchestrator._lazy import lazy_exports

# Each exported name and the module it comes from. The data directory's names are imported
# above, at once (its module is the standard library's ``os`` and ``pathlib``): ``data_dir`` is
# also its module's name, and the import of a submodule sets that name on this package, so the
# function must be bound here before anyone imports the module.
_EXPORTS = {
    "CONTENT_TYPE": "orchestrator._core.metrics",
    "DEFAULT_MAX_SESSIONS": "orchestrator._core.limits",
    "DEFAULT_POOL_IDLE": "orchestrator._core.limits",
    "DEFAULT_SERVE_POOL": "orchestrator._core.limits",
    "LOCAL_KEY_FILE": "orchestrator._core.tenants",
    "LOCAL_TENANT": "orchestrator._core.tenants",
    "MAX_POOL_SIZE": "orchestrator._core.limits",
    "OK": "orchestrator._core.readiness",
    "UNCHECKED": "orchestrator._core.readiness",
    "BackendConfig": "orchestrator._core.config",
    "Metrics": "orchestrator._core.metrics",
    "OrchestratorConfig": "orchestrator._core.config",
    "TenantKeys": "orchestrator._core.tenants",
    "add_operator": "orchestrator._core.tenant_admin",
    "add_tenant": "orchestrator._core.tenant_admin",
    "check_metadata": "orchestrator._core.session_control",
    "check_task": "orchestrator._core.owners",
    "current_call": "orchestrator._core.call_context",
    "hash_key": "orchestrator._core.tenants",
    "lifetime_end": "orchestrator._core.session_control",
    "local_key": "orchestrator._core.tenants",
    "local_tenant": "orchestrator._core.tenants",
    "new_call_id": "orchestrator._core.call_context",
    "open_backend": "orchestrator._core.engines",
    "parse_quotas": "orchestrator._core.tenant_admin",
    "read_operators": "orchestrator._core.tenant_admin",
    "read_tenants": "orchestrator._core.tenant_admin",
    "rotate_key": "orchestrator._core.tenant_admin",
    "task_scope": "orchestrator._core.owners",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from orchestrator._core.call_context import current_call, new_call_id
    from orchestrator._core.config import BackendConfig, OrchestratorConfig
    from orchestrator._core.engines import open_backend
    from orchestrator._core.limits import (
        DEFAULT_MAX_SESSIONS,
        DEFAULT_POOL_IDLE,
        DEFAULT_SERVE_POOL,
        MAX_POOL_SIZE,
    )
    from orchestrator._core.metrics import CONTENT_TYPE, Metrics
    from orchestrator._core.owners import check_task, task_scope
    from orchestrator._core.readiness import OK, UNCHECKED
    from orchestrator._core.session_control import check_metadata, lifetime_end
    from orchestrator._core.tenant_admin import (
        add_operator,
        add_tenant,
        parse_quotas,
        read_operators,
        read_tenants,
        rotate_key,
    )
    from orchestrator._core.tenants import (
        LOCAL_KEY_FILE,
        LOCAL_TENANT,
        TenantKeys,
        hash_key,
        local_key,
        local_tenant,
    )

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_POOL_IDLE",
    "DEFAULT_SERVE_POOL",
    "LOCAL_KEY_FILE",
    "LOCAL_TENANT",
    "MAX_POOL_SIZE",
    "OK",
    "TENANTS_FILE",
    "UNCHECKED",
    "BackendConfig",
    "Metrics",
    "OrchestratorConfig",
    "TenantKeys",
    "add_operator",
    "add_tenant",
    "check_metadata",
    "check_task",
    "current_call",
    "data_dir",
    "hash_key",
    "lifetime_end",
    "local_key",
    "local_tenant",
    "migrate_legacy_data_dir",
    "new_call_id",
    "open_backend",
    "parse_quotas",
    "read_operators",
    "read_tenants",
    "rotate_key",
    "task_scope",
]
