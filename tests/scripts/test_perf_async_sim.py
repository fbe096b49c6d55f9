"""scripts/perf/async_sim.py: the generation model against hand arithmetic, and the real
scheduler end to end at tiny sizes (what must hold whatever the machine's load: every step
trains G x n trajectories, staleness never passes its bound, async with room to run ahead
beats sync when update and generation cost the same, and no schedule beats the update)."""

from __future__ import annotations

import pytest

from scripts.perf.async_sim import GenModel, RunConfig, compare, run_async, run_sync
from scripts.perf.eval_sim import CostModel, Shape

COST = CostModel(a=0.02, b=0.0, c=0.0, p=0.0, retrieval_s=0.1)  # 20 ms a token whatever the batch
# Trajectories of 1, 2 and 3 turns: groups differ, so sync waits for stragglers.
SHAPES = [Shape(10, ((20, 5), (20, 0))), Shape(10, ((20, 0),)), Shape(10, ((20, 5), (20, 5), (20, 0)))]


def test_token_time_context_and_prefill_by_hand():
    c = CostModel(a=0.007, b=25e-6, c=20e-9, p=25e-6, retrieval_s=0.05)
    m = GenModel.build([Shape(10, ((4, 6), (2, 0)))], "uniform", n=2, slots=16, cost=c)
    # prefill: the prompt (10), then the first turn's output and observation (4 + 6), per 6 generated
    assert m.rho == pytest.approx(20 / 6)
    # context seen by each generated token: 10..13 in turn 1, then 20, 21 in turn 2
    assert m.ctx_mean == pytest.approx((10 + 11 + 12 + 13 + 20 + 21) / 6)
    t16 = 0.007 + 25e-6 * 16 + 20e-9 * 16 * m.ctx_mean + 25e-6 * 16 * m.rho
    assert m.t_tok(16) == pytest.approx(t16)
    assert m.duration(m.shapes[0]) == pytest.approx(6 * t16 + 1 * 0.05)  # one search between the turns
    assert m.step_work(4) == pytest.approx(4 * 2 * (6 * t16 + 0.05) / 16)
    assert m.group_shapes(3) == m.group_shapes(3) and len(m.group_shapes(3)) == 2  # same draws in every mode


def test_sync_and_async_end_to_end():
    cfg = RunConfig(groups_per_step=4, steps=8, warmup=2, ms_per_s=20.0)
    res = compare(SHAPES, "mixed", n=2, slots=8, cost=COST, cfg=cfg, update="sync", stalenesses=(0, 1, 2), seeds=1)
    update = res["update_s"]
    assert update > 0.4  # the calibration measured sync's generation phase (at least one 20-token turn)
    for name, (r,) in res["runs"].items():
        assert r["trajectories"] == cfg.steps * cfg.groups_per_step * 2, name
        assert 0.0 <= r["trainer_idle"] <= 1.0 and -0.05 <= r["rollout_idle"] <= 1.0, name
        # no schedule steps faster than its update: trajectories/s <= G n / update (+ timer noise)
        assert r["traj_per_s"] <= 1.1 * cfg.groups_per_step * 2 / update, name
    med = res["median"]
    for s in (0, 1, 2):
        assert med[f"async s={s}"]["staleness_max"] <= s
    assert med["async s=0"]["staleness_mean"] == 0 and med["sync"]["staleness_mean"] == 0
    # sync: generation, then an update of the same cost: the trainer waits about half the time
    assert 0.3 < med["sync"]["trainer_idle"] < 0.7
    # with room to run a step ahead, generation hides behind the update (ideal: 2x)
    for s in (1, 2):
        assert med[f"async s={s}"]["speedup"] > 1.3
        assert med[f"async s={s}"]["trainer_idle"] < med["sync"]["trainer_idle"]


def test_live_batch_queues_for_slots_and_fixed_refuses_to_oversubscribe():
    live = GenModel.build(SHAPES, "mixed", n=2, slots=4, cost=COST, batch="live")
    cfg = RunConfig(groups_per_step=4, steps=3, warmup=1, update_s=0.2, ms_per_s=10.0)
    r = run_sync(live, cfg)  # 8 trajectories on 4 slots: half of them queue
    assert r["trajectories"] == 3 * 4 * 2
    assert run_async(live, cfg, 1)["trajectories"] == 3 * 4 * 2
    fixed = GenModel.build(SHAPES, "mixed", n=2, slots=4, cost=COST)
    with pytest.raises(ValueError, match="never oversubscribed"):
        run_sync(fixed, cfg)
    with pytest.raises(ValueError, match="fixed or live"):
        GenModel.build(SHAPES, "mixed", n=2, slots=4, cost=COST, batch="dynamic")


def test_live_batch_counts_every_turn_that_starts_together():
    """Four one-turn trajectories start at once on 4 slots: each decodes at batch 4 (not 1, 2, 3,
    4 in the order they happened to join), so all end together and the engine is never idle."""
    cost = CostModel(a=0.01, b=0.01, c=0.0, p=0.0, retrieval_s=0.1)
    live = GenModel.build([Shape(10, ((20, 0),))], "uniform", n=2, slots=4, cost=cost, batch="live")
    r = run_sync(live, RunConfig(groups_per_step=2, steps=3, warmup=1, update_s=0.0, ms_per_s=50.0))
    assert r["gen_phase_s"] == pytest.approx(20 * live.t_tok(4), rel=0.15)  # 1.0 s; at batch 1 it is 0.4 s
    assert r["rollout_idle"] < 0.12
