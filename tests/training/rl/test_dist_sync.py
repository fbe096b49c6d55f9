"""SGLang's distributed weight-sync protocol (/init_weights_update_group, then per update
/begin_weight_update + /update_weights_from_distributed + /end_weight_update) over gloo on CPU,
against a stand-in server that joins the group the way SGLang does (training.rl.dist_sync.join_group).
Real SGLang: tests/engines/test_served_model.py::test_distributed_sync_by_broadcast."""

from __future__ import annotations

import torch

from harness.backends.sglang import SGLangBackend
from harness.tokenization import byte_tokenizer
from tests.harness.conftest import ServerThread
from tests.helpers.sglang_standin import SGLangStandIn
from training.rl.dist_sync import DistributedWeightSync


def test_weights_arrive_by_broadcast_in_announced_order():
    standin = SGLangStandIn()
    with ServerThread(standin.app()) as server:
        backend = SGLangBackend(server.url, tokenizer=byte_tokenizer(), health_check=False, max_context=512)
        sync = DistributedWeightSync(backend, comm="gloo", timeout_s=60)
        torch.manual_seed(0)
        state = {"a.weight": torch.randn(3, 4), "b.bias": torch.randn(5).to(torch.bfloat16)}
        sync.push(state, 1)
        init = standin.of("/init_weights_update_group")[0]
        assert (init["rank_offset"], init["world_size"], init["backend"]) == (1, 2, "gloo")
        upd = standin.of("/update_weights_from_distributed")[0]
        assert upd["names"] == ["a.weight", "b.bias"] and upd["dtypes"] == ["float32", "bfloat16"]
        assert upd["shapes"] == [[3, 4], [5]] and upd["weight_version"] == "1" and upd["flush_cache"]
        for k, v in state.items():
            assert torch.equal(standin.received[k], v)
        state2 = {k: v + 1 for k, v in state.items()}
        sync.push(state2, 2)  # the group is kept: one init, two updates
        assert len(standin.of("/init_weights_update_group")) == 1
        session = [p for p, _ in standin.calls if "weight" in p and "init" not in p]
        assert session == ["/begin_weight_update", "/update_weights_from_distributed", "/end_weight_update"] * 2
        assert all(torch.equal(standin.received[k], v) for k, v in state2.items())
        assert backend.weight_version == "2" and standin.version == "2"
        sync.push(state, 3, in_flight="pause")  # asynchronous RL: requests in flight retracted around it
        last = [p for p, _ in standin.calls][-5:]
        assert last == [
            "/pause_generation",
            "/begin_weight_update",
            "/update_weights_from_distributed",
            "/end_weight_update",
            "/continue_generation",
        ]


def test_trainer_syncs_by_broadcast(tmp_path):
    """rollout.weight_sync=distributed: the trainer's initial sync and one step's update reach the
    stand-in by broadcast (no model directory written), equal to the policy's weights."""
    from harness.config import compose
    from tests.training.rl.test_sync_two_ranks import RECIPE
    from training.build import build_trainer
    from training.config import TrainConfig
    from training.engine import full_state_dict
    from training.rewards import REWARDS

    if "sync2_length" not in REWARDS:

        class Length:
            def __call__(self, traj):
                return len(traj.response_text) / 10.0, {}

        REWARDS.register("sync2_length", Length)
    (tmp_path / "r.yaml").write_text(RECIPE)
    cfg = compose(TrainConfig, [tmp_path / "r.yaml"], ["optim.zero_stage=0", "rollout.weight_sync=distributed"])
    standin = SGLangStandIn()
    with ServerThread(standin.app()) as server:
        backend = SGLangBackend(server.url, tokenizer=byte_tokenizer(), health_check=False, max_context=4096)
        trainer = build_trainer(cfg, tmp_path / "run", backend=backend)
        trainer.step()
    assert [u["weight_version"] for u in standin.of("/update_weights_from_distributed")] == ["0", "1"]
    assert not standin.of("/update_weights_from_disk") and not (tmp_path / "run" / "sync").exists()
    for k, v in full_state_dict(trainer.policy).items():
        assert torch.equal(standin.received[k], v), k
