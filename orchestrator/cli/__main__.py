"""``python -m orchestrator.cli``: the same as the ``sbx`` console script."""

from orchestrator.cli import main

main()
