"""BM25 findability of the demo's supporting passages, as a table:
``python -m scripts.demo_retrievability [--split test,val,train,test_v1,train_v1] [--k 3,5]``
(the measure is :mod:`benchmarks.demo_data.retrievability`)."""

from __future__ import annotations

import argparse
import logging

from benchmarks.demo_data.retrievability import markdown, retrievability

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="BM25 findability of the demo's supporting passages")
    parser.add_argument("--split", default="test,val,train,test_v1,train_v1", help="comma-separated demo splits")
    parser.add_argument("--k", default="3,5", help="comma-separated top-k cut-offs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ks = tuple(int(k) for k in args.k.split(","))
    logger.info("%s", markdown(retrievability(args.split.split(","), ks), ks))


if __name__ == "__main__":
    main()
