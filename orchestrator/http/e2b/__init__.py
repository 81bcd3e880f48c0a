"""E2B's protocol over sandhold: the control API, envd's process and filesystem services and
the code interpreter, so that E2B's unmodified SDKs drive sandhold sessions
(``sandhold serve --e2b-port``; docs/e2b.md). Everything maps onto the tool layer
(``Orchestrator.call``): policies, quotas, owners, audit and crash safety hold as for every
other interface."""

from orchestrator.http.e2b._app import build_e2b_app

__all__ = ["build_e2b_app"]
