"""The fault battery's records and runner: each :class:`Fault` (registered with :func:`fault`,
in the order :mod:`programs.faults` imports its module), run in a folder of its own, ``workers``
at a time, into one :class:`Outcome` each, printed one line per fault."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Outcome:
    fault: str
    expected: str
    observed: str
    ok: bool
    seconds: float


@dataclass(frozen=True)
class Fault:
    name: str
    expected: str
    check: Callable[[Path], tuple[bool, str]]  # (handled as expected, what was observed)


FAULTS: list[Fault] = []


def fault(name: str, expected: str) -> Callable:
    def register(fn: Callable[[Path], tuple[bool, str]]) -> Callable:
        FAULTS.append(Fault(name, expected, fn))
        return fn

    return register


# ---- running ----------------------------------------------------------------------------------
def run_one(f: Fault, root: Path) -> Outcome:
    tmp = root / f.check.__name__
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        ok, observed = f.check(tmp)
    except Exception as e:  # a fault that breaks the battery itself is a failure, reported as such
        ok, observed = False, f"battery error: {type(e).__name__}: {e}"
    return Outcome(f.name, f.expected, observed, ok, time.monotonic() - t0)


def run_battery(only: list[str] | None = None, workers: int = 2, keep: Path | None = None) -> list[Outcome]:
    """Run the faults (``only``: names of their check functions) and return their outcomes."""
    chosen = [f for f in FAULTS if not only or f.check.__name__ in only]
    with tempfile.TemporaryDirectory(prefix="harness-faults-") as scratch:
        root = keep or Path(scratch)
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return list(pool.map(lambda f: run_one(f, root), chosen))


def print_table(outcomes: list[Outcome]) -> None:
    """One line per fault: pass/FAIL, seconds, the fault, what was expected and what was observed."""
    for o in outcomes:
        print(
            f"{'pass' if o.ok else 'FAIL'} {o.seconds:4.0f} s  {o.fault}: expected {o.expected}; observed {o.observed}"
        )
