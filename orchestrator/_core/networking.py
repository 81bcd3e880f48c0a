"""A session's network, as the orchestrator governs it: the egress allowlist its proxy applies
(capped by its tenant when it is handed out, narrowed on request), its proxy's log of attempts,
and the accounting of what it moves (``egress_round``), which the reaper reads each round.

Invariants: the rules a proxy applies never pass the session's policy nor its tenant's cap
(``policy.egress``); a session without a network (``mode: none``) has nothing to read, and asks
the engine nothing; nothing read from a proxy fails the call it is read for (a refused read is
an empty answer, logged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator._core.call_context import current_call
from orchestrator._core.egress_round import EgressAccounting
from orchestrator._core.metrics import Metrics
from orchestrator._core.tenants import TenantConfig
from orchestrator.backend.base import Backend
from orchestrator.errors import InvalidArgumentError, OrchestratorError
from orchestrator.policy.egress import capped_allowlist, narrowed_allowlist
from orchestrator.session.session import Session

__all__ = ["Networking"]

log = logging.getLogger(__name__)


class Networking:
    def __init__(
        self,
        backend: Backend,
        metrics: Metrics,
        tenant_config: Callable[[str], TenantConfig | None],
    ) -> None:
        self._backend = backend
        self._tenant_config = tenant_config
        # Bytes and refusals of every proxy, read at the reaper's cadence and at a session's end.
        self.accounting = EgressAccounting(backend, metrics, tenant_config)

    async def admit(self, session: Session) -> None:
        """A session being handed out: its tenant's egress cap applied, and refused at once if
        its tenant is over its egress quota."""
        cap = capped_allowlist(session.policy.network, self._tenant_cap(session.tenant))
        if cap is not None:
            await self._backend.set_egress_allow(session.container_id, cap)
        await self.accounting.admit(session)

    async def log(self, session: Session) -> list[dict[str, Any]]:
        """The session's egress attempts, oldest first; empty when its policy has no network."""
        if session.policy.network.mode == "none":
            return []
        return await self._backend.network_log(session.container_id)

    async def set_allowlist(self, session: Session, allow: Any) -> list[str]:
        """Replace the session's egress allowlist for new connections, within its policy's and
        its tenant's cap (``policy.egress``); the rules now in force."""
        if not isinstance(allow, list):
            raise InvalidArgumentError("allow must be a list of rules")
        rules = narrowed_allowlist(session.policy.network, allow, self._tenant_cap(session.tenant))
        await self._backend.set_egress_allow(session.container_id, rules)
        log.info("session %s: egress allowlist now %s", session.id, rules)
        return rules

    async def denied_since(self, session: Session, since: float) -> list[dict[str, Any]]:
        """``{host, port, rule}`` of each egress attempt refused since ``since`` (wall clock,
        which the proxy's container shares), for a call's result; empty without a network or
        when the session has ended meanwhile. The attempts since then, allowed or not, and
        their bytes are tallied on the current call (``CallContext.egress``) for its audit
        record."""
        if session.policy.network.mode == "none" or session.closed:
            return []
        try:
            entries = await self._backend.network_log(session.container_id)
        except OrchestratorError as exc:
            log.warning("session %s: its egress log could not be read: %s", session.id, exc)
            return []
        recent = [e for e in entries if e["time"] >= since]
        denied = [e for e in recent if e["decision"] == "deny"]
        if recent and (call := current_call()) is not None:
            call.egress.update(
                attempts=len(recent),
                denied=len(denied),
                bytes_sent=sum(e["bytes_sent"] for e in recent),
                bytes_received=sum(e["bytes_received"] for e in recent),
            )
        return [{"host": e["host"], "port": e["port"], "rule": e["rule"]} for e in denied]

    def _tenant_cap(self, tenant: str) -> Sequence[str] | None:
        limits = self._tenant_config(tenant)
        return limits.egress_allow if limits is not None else None
