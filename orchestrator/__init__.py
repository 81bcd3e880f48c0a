"""sbx: a container-isolated sandbox orchestrator."""
