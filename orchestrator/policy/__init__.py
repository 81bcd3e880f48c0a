"""Policies: the models, loading with ``extends``, the command rules and every argument
bound. Pure: nothing here starts a container or knows which interface asked."""

from orchestrator.policy._validation import first_problem
from orchestrator.policy.model import Policy, load_policy, shipped_policy_names

__all__ = ["Policy", "first_problem", "load_policy", "shipped_policy_names"]
