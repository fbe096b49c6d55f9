"""The fault battery's command line: ``python -m scripts.faults [--only NAME ...] [--workers 2]
[--keep DIR]``. The battery itself is :mod:`programs.faults` (its docstring lists the faults)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from programs import faults
from programs.faults import FAULTS, print_table, run_battery


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=faults.__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help=f"run these faults only: {', '.join(f.check.__name__ for f in FAULTS)}")
    ap.add_argument("--workers", type=int, default=2, help="faults run at once (default 2)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    outcomes = run_battery(args.only, args.workers, args.keep)
    print_table(outcomes)
    failed = [o for o in outcomes if not o.ok]
    print(f"{len(outcomes) - len(failed)}/{len(outcomes)} faults handled as expected in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
