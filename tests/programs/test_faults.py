"""The fault battery of issue 23 (``python -m scripts.faults``) in CI: every fault it puts the
CLI through is handled as expected. Slow tier: about a dozen short ``harness`` processes, two at
a time."""

from __future__ import annotations

import pytest

from programs.faults import FAULTS, print_table, run_battery


@pytest.mark.slow
def test_every_fault_of_the_battery_is_handled(capsys):
    outcomes = run_battery(workers=2)
    print_table(outcomes)
    assert len(outcomes) == len(FAULTS) >= 11
    failed = [f"{o.fault}: {o.observed}" for o in outcomes if not o.ok]
    assert not failed, "\n".join(failed) + "\n" + capsys.readouterr().out
