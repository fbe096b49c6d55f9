"""Write the demo benchmark's files: ``python -m scripts.build_demo [--out DIR]`` (default: the
packaged ``benchmarks/demo_data``). The world and its splits are :mod:`benchmarks.demo_data.build_demo`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from benchmarks.demo_data import build_demo
from benchmarks.demo_data.build_demo import HERE, write

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=build_demo.__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: the packaged demo_data)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    counts = write(args.out)
    logger.info("wrote %s to %s", ", ".join(f"{name}: {k}" for name, k in counts.items()), args.out)


if __name__ == "__main__":
    main()
