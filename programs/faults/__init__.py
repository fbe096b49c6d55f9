"""The fault battery (issue 23): put ``harness`` through the faults a new user met, against the
real CLI (``python -m cli.main`` in child processes), on tiny local data (the packaged
demo, the scripted backend, the in-memory retriever or a loopback Search-R1 ``/retrieve``
server run here), and print one line per fault: pass/FAIL, seconds, fault, expected, observed.

    python -m scripts.faults [--only NAME ...] [--workers 2] [--keep DIR]

Exit status 1 when a fault is not handled as expected. ``tests/programs/test_faults.py`` runs
it (slow tier). Each fault works in its own temporary folder; the faults run ``--workers`` at a
time (each is one or a few short ``harness`` processes).

The battery (:mod:`programs.faults.battery`: its records, running and table) runs the faults of
:mod:`programs.faults.issue23`, :mod:`programs.faults.issue31` and :mod:`programs.faults.issue44`,
in that order, over the tools of :mod:`programs.faults.kit` (the child ``harness``, a loopback
retrieval server, the scripted eval's arguments). A program on the top floor: it runs the CLI,
which no library module names.
"""

from __future__ import annotations

# Each module registers its faults when imported: this order is the battery's order.
from programs.faults import issue23, issue31, issue44  # noqa: F401
from programs.faults.battery import FAULTS, Fault, Outcome, print_table, run_battery

__all__ = ["FAULTS", "Fault", "Outcome", "print_table", "run_battery"]
