"""Real SGLang (through the ``sglang`` backend) and real vLLM (through ``openai``), CPU, float32:
the agent, stop semantics, logprobs, ``n``, greedy parity with ``hf``, and RL weight sync of full
weights from disk (SGLang ``/update_weights_from_disk``; vLLM ``/collective_rpc reload_weights``,
in its development mode). Each engine is started once for all its tests."""

from __future__ import annotations

import pytest

from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def backend(request, model_dir, tmp_path_factory):
    """One engine at a time: its server lives while its tests run, then stops before the next.
    Generation attempts may take 10 minutes: on a loaded 2-core VM a 300-token completion took
    over the default 120 s, and the client's retry left the first request running on the server
    (its weight syncs then found the server busy)."""
    with checks.serve(request.param, model_dir, tmp_path_factory.mktemp(f"{request.param}-logs")) as server:
        if request.param == "sglang":
            from harness.backends.sglang import SGLangBackend

            b = SGLangBackend(server.url, timeout=600.0)
            assert b.model_path == model_dir  # the tokenizer came from what the server reports on /model_info
        else:
            from harness.backends.openai import OpenAIBackend

            b = OpenAIBackend(server.url, model=model_dir, timeout=600.0)
        yield b
        b.close()


def test_agent_runs_on_demo(backend):
    checks.check_agent_on_demo(backend)


def test_length_finish(backend):
    checks.check_length_finish(backend)


def test_eos_finish(backend):
    checks.check_eos_finish(backend)


def test_stop_string_kept(backend, hf_backend):
    checks.check_stop_string_kept(backend, hf_backend)


def test_logprobs(backend):
    checks.check_logprobs(backend)


def test_sampled_logprobs_and_the_temperature(backend, model_dir):
    """Both engines, as a training launch starts them, report logprobs at the sampling temperature
    (what the trainer scores, so the decoupled loss works at any temperature): SGLang by default,
    vLLM with ``--logprobs-mode processed_logprobs``. vLLM's default, ``raw_logprobs``, is of the
    logits at temperature 1 (this check with ``scaled=False`` passed on it; docs/training.md)."""
    checks.check_sampled_logprobs_temperature(backend, model_dir, scaled=True)


def test_n_samples_in_one_request(backend):
    checks.check_n_samples(backend)


def test_greedy_parity_with_hf(backend, hf_backend):
    checks.check_greedy_parity(backend, hf_backend)


def test_weight_sync_changes_outputs_and_version(backend, model_dir, tmp_path):
    """training.weight_sync pushes a changed checkpoint: outputs and weight version change, and the
    server's logprobs of its own tokens are those of the pushed weights (so every weight arrived,
    the tied head included); pushing the original weights back restores the original outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.weight_sync import sync_weights

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    ids = checks.chat_ids(backend.tokenizer, "What is the capital of France?")
    before = checks.gen(backend, ids, max_new_tokens=16)

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # tied embeddings stay tied, as in training
        for p in model.parameters():
            if p.ndim == 2:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    changed = model.state_dict()
    assert changed["lm_head.weight"].data_ptr() == changed["model.embed_tokens.weight"].data_ptr()
    kw = dict(scratch=tmp_path / "sync", tokenizer=backend.tokenizer, model_config=model.config)
    try:
        sync_weights(backend, changed, 1, **kw)
        after = checks.gen(backend, ids, max_new_tokens=16, logprobs=True)
        assert after.weight_version == "1" and backend.weight_version == "1"
        assert after.token_ids != before.token_ids
        with torch.no_grad():  # the pushed model scores the served tokens as the server did
            logits = model(torch.tensor([ids + after.token_ids])).logits[0, len(ids) - 1 : -1]
        ours = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(after.token_ids)[:, None])[:, 0]
        diff = (ours - torch.tensor(after.logprobs)).abs().max().item()
        assert diff < 1e-2, f"served logprobs differ from the pushed weights' by up to {diff:.3g}"
        assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["weights-v1"]
    finally:
        sync_weights(backend, original, 2, **kw)  # leave the server as the other tests expect it
    restored = checks.gen(backend, ids, max_new_tokens=16)
    assert restored.weight_version == "2"
    assert restored.token_ids == before.token_ids
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["weights-v2"]  # older copy removed


def test_distributed_sync_by_broadcast(backend, model_dir):
    """rollout.weight_sync=distributed against real SGLang on CPU: the server's worker joins a gloo
    group with the trainer (/init_weights_update_group), each update is broadcast tensor by tensor
    inside a weight-update session; the server then scores its own tokens as the pushed weights do,
    and pushing the originals back restores the original outputs. No model directory is written."""
    if backend.name != "sglang":
        pytest.skip(
            "vLLM 0.32's in-memory weight transfer (/init_weight_transfer_engine + /update_weights) "
            "uses NCCL or CUDA IPC: not on CPU; vLLM syncs from disk"
        )
    import torch
    from transformers import AutoModelForCausalLM

    from training.rl.dist_sync import DistributedWeightSync

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    ids = checks.chat_ids(backend.tokenizer, "What is the capital of France?")
    before = checks.gen(backend, ids, max_new_tokens=16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    sync = DistributedWeightSync(backend, comm="gloo", timeout_s=300)
    try:
        sync.push(model.state_dict(), 11)
        after = checks.gen(backend, ids, max_new_tokens=16, logprobs=True)
        assert after.weight_version == "11" and after.token_ids != before.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids + after.token_ids])).logits[0, len(ids) - 1 : -1]
        ours = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(after.token_ids)[:, None])[:, 0]
        diff = (ours - torch.tensor(after.logprobs)).abs().max().item()
        assert diff < 1e-2, f"served logprobs differ from the broadcast weights' by up to {diff:.3g}"
    finally:
        sync.push(original, 12)  # the group is kept: the second push reuses it
    restored = checks.gen(backend, ids, max_new_tokens=16)
    assert restored.weight_version == "12" and restored.token_ids == before.token_ids


@pytest.mark.parametrize("in_flight", ["drain", "pause"])
def test_weight_sync_with_a_completion_in_flight(backend, model_dir, tmp_path, in_flight):
    """Asynchronous RL's weight sync while a long completion runs. ``drain``: the update waits
    for it (SGLang's model-update lock; vLLM ``/pause?mode=wait``), so it ends on the old weights.
    ``pause`` (SGLang ``/pause_generation`` retract → update → ``/continue_generation``; vLLM
    ``/pause?mode=keep`` + preemption): the update does not wait; the completion goes on under the
    new weights and reports them. The completion runs on perturbed weights (v11), which never
    say EOS within the budget, so it is surely in flight when the second perturbation (v12)
    arrives. Prints the sync's stall (the update call alone: the weights are saved beforehand)."""
    import threading
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from harness.backends.base import WeightUpdate
    from training.weight_sync import sync_weights

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    dirs = {}
    for seed in (11, 12):  # two perturbed checkpoints, saved as model folders before anything is timed
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for k, p in model.named_parameters():
                if p.ndim == 2:
                    p.copy_(original[k] + 0.05 * torch.randn(p.shape, generator=g))
        dirs[seed] = tmp_path / f"v{seed}"
        model.save_pretrained(dirs[seed], safe_serialization=True)
        backend.tokenizer.save_pretrained(dirs[seed])
    ids = checks.chat_ids(backend.tokenizer, "Count from 1 to 500, separated by commas.")
    n = 300

    def one_sync() -> tuple[float, float, float, object]:
        """The completion on v11 in a thread; one second in, the update to v12."""
        backend.update_weights(WeightUpdate(str(dirs[11]), 11))
        box: dict = {}
        t0 = time.perf_counter()

        def run() -> None:
            box["c"] = checks.gen(backend, ids, max_new_tokens=n)
            box["done"] = time.perf_counter() - t0

        runner = threading.Thread(target=run)
        runner.start()
        time.sleep(1.0)
        started = time.perf_counter() - t0
        backend.update_weights(WeightUpdate(str(dirs[12]), 12, in_flight=in_flight))
        synced = time.perf_counter() - t0
        runner.join(600)
        c = box["c"]
        print(
            f"{backend.name} {in_flight}: sync stall {synced - started:.2f} s; completion of {len(c.token_ids)} "
            f"tokens ended at {box['done']:.1f} s; the sync began at {started:.1f} s, returned at {synced:.1f} s"
        )
        assert len(c.token_ids) == n and box["done"] > started  # in flight when the update began
        return started, synced, box["done"], c

    try:
        started, synced, done, c = one_sync()
        if in_flight == "drain":
            assert done <= synced + 0.5  # the update waited for the completion
            assert c.weight_version == "11"  # which ended on the weights it started on
        else:
            if synced > done:
                # Seen once in CI on a loaded 2-core VM (vLLM 0.32): the update returned a second
                # after the completion ended, as a drain does. The retried sync shows whether the
                # pause works at all; the tag must be honest either way.
                assert c.weight_version == "11"  # it ended before the new weights were in
                print("the update waited for the completion this time; once more")
                started, synced, done, c = one_sync()
            assert synced < done  # the update did not wait for it
            assert c.weight_version == "12"  # it finished under the new weights
    finally:
        kw = dict(scratch=tmp_path / "sync", tokenizer=backend.tokenizer, model_config=model.config)
        sync_weights(backend, original, 2, **kw)  # as the other tests leave it
