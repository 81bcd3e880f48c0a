"""The audit log: append-only JSON lines chained by hash, its records, writer and verifier."""

from orchestrator.audit._log import AuditConfig, AuditLog

__all__ = ["AuditConfig", "AuditLog"]
