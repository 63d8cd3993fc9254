"""`python -m bench` (`make bench`): run the benchmarks and record their results in docs/benchmarks.md.

Each benchmark is a module with ``main(events=..., quick=...)``; add new ones to ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module; run in this order.
BENCHMARKS = {"ingest": "bench.ingest_bench", "merge": "bench.merge_bench"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="cdclake benchmarks")
    parser.add_argument("--events", type=int, default=None, help="events per benchmark (default 1,000,000)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (100k events); docs untouched")
    parser.add_argument(
        "--only", action="append", choices=sorted(BENCHMARKS), help="run only this benchmark (repeatable)"
    )
    args = parser.parse_args(argv)
    for name, module in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        importlib.import_module(module).main(events=args.events, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
