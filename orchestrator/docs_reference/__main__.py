"""``python -m orchestrator.docs_reference [--check] [ROOT]``: write the generated reference
pages under ROOT (default: the current directory, a checkout's root), or with ``--check`` only
say which differ and exit 1."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.docs_reference import stale_pages, write_pages

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.docs_reference")
    parser.add_argument("root", nargs="?", type=Path, default=Path.cwd())
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    args = parser.parse_args(argv)
    if not (args.root / "docs").is_dir():
        parser.error(f"{args.root} has no docs/ directory: give the checkout's root")
    if args.check:
        stale = stale_pages(args.root)
        for path in stale:
            print(f"{path}: differs from the code; run python -m orchestrator.docs_reference")
        return 1 if stale else 0
    for file in write_pages(args.root):
        print(f"wrote {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
