"""``python -m orchestrator.cli``: the same as the ``sandhold`` console script."""

from orchestrator.cli import main

main()
