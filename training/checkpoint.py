"""Checkpoints: written atomically, loaded with safe loaders, resumed exactly.

A checkpoint directory ``checkpoints/step-N/`` holds

- ``model.safetensors`` (+ ``config.json``): the full policy weights (gathered under ZeRO-3);
  with the tokenizer's files where the trainer gives one (RL, SFT), so ``harness eval --model
  .../checkpoints/step-N`` evaluates an intermediate policy as it does ``final/``;
- ``model_optim_rank{r}.pt``: each rank's optimizer (and its ZeRO partition, fp32 master weights
  included) and LR-scheduler states, loaded with ``weights_only=True`` (tensors and plain
  containers only: nothing is unpickled);
- the same two for the critic when there is one (``critic.safetensors``, ``critic_optim_rank{r}.pt``);
- ``trainer_state.json``: step, data position, policy version, the run's id, every RNG state
  (python, numpy, torch) of rank 0, and the size and sha256 of every other file (``files``).

It is written to ``.step-N.tmp`` and renamed into place (``os.replace``), so a crash never leaves
a half checkpoint that :func:`latest_checkpoint` would pick up. A checkpoint damaged afterwards
(a truncated or corrupted file) fails :func:`verify_checkpoint`; :func:`latest_checkpoint` then
falls back to the newest intact one with a warning, and raises :class:`CheckpointError` when
none is intact.

The final model is exported in Hugging Face format (``save_pretrained`` + tokenizer), loadable
by ``harness eval --model DIR``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from harness import safe_delete
from harness.fsutil import atomic_dir, commit_dir, tmp_sibling
from harness.models import untie
from training.divergence import DivergenceError, check_finite
from training.engine import full_state_dict, load_full_state_dict, rank_and_world, unwrap
from training.weight_sync import barrier

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from training.config import TrainConfig
    from training.divergence import NonFiniteGuard

# A checkpoint's trainer state (``trainer_state.json``): JSON values, read back from disk.
TrainerState = dict[str, object]


class DataPosition(Protocol):
    """A trainer's data sampler, as a checkpoint keeps it (``training.rl.rollout.PromptSampler``,
    ``training.epochs.EpochSampler``)."""

    def state(self) -> dict[str, int]: ...

    def load(self, state: dict[str, int]) -> None: ...


class Positioned(Protocol):
    """What :func:`save_position` and :func:`restore_position` read and set on a trainer."""

    cfg: TrainConfig
    out: Path
    step_no: int
    _resumed: int | None
    run_id: str
    sampler: DataPosition
    guard: NonFiniteGuard


logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"


class CheckpointError(RuntimeError):
    """No usable checkpoint: the message names the checkpoint(s) and what is wrong with them."""


def rng_state() -> dict[str, list[object]]:
    """Every RNG the trainer touches, as JSON-able lists."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.random.get_rng_state().tolist(),
    }


def set_rng_state(state: dict[str, list[object]]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.random.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def save_checkpoint(
    out_dir: Path,
    step: int,
    policy: torch.nn.Module,
    state: TrainerState,
    critic: torch.nn.Module | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """Write ``out_dir/step-{step}`` atomically (every rank calls this; rank 0 writes the shared
    files, the ``tokenizer``'s among them when given)."""
    rank, _ = rank_and_world()
    final = out_dir / f"step-{step}"
    tmp = tmp_sibling(final)  # one name on every rank: all of them write into it
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    for name, eng in (("model", policy), ("critic", critic)):
        if eng is None:
            continue
        weights = full_state_dict(eng)  # collective under ZeRO-3: every rank takes part
        try:  # every rank holds the full weights here, so every rank refuses alike
            check_finite(weights, f"not writing checkpoint {final}")
        except DivergenceError:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if rank == 0:
            write_safetensors(untie({k: v.contiguous() for k, v in weights.items()}), tmp / f"{name}.safetensors")
            with write_errors(tmp):  # config and tokenizer files: a full disk named by the folder
                if name == "model" and hasattr(unwrap(eng), "config"):
                    unwrap(eng).config.save_pretrained(tmp)
                if name == "model" and tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        opt = {"optimizer": eng.optimizer.state_dict()}
        if getattr(eng, "lr_scheduler", None) is not None:
            opt["scheduler"] = eng.lr_scheduler.state_dict()
        with write_errors(tmp / f"{name}_optim_rank{rank}.pt") as path:
            torch.save(opt, path)
    barrier()
    if rank == 0:
        files = {p.name: file_record(p) for p in sorted(tmp.iterdir()) if p.is_file() and p.name != STATE_FILE}
        with write_errors(tmp / STATE_FILE):
            (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step, "rng": rng_state(), "files": files}))
        with write_errors(tmp):  # its marker
            commit_dir(tmp, final, kind="checkpoint")
    barrier()
    return final


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``safetensors.torch.save_file``, with a failure to write (a full disk: safetensors reports
    it as a ``SafetensorError`` quoting the OS error, without the file) as an ``OSError`` naming
    ``path``."""
    with write_errors(path):
        save_file(tensors, str(path))


@contextlib.contextmanager
def write_errors(path: Path) -> Iterator[Path]:
    """Writing ``path`` (a file, or a folder a library writes files into) with code that reports a
    failed write (a full disk, say) without the file: safetensors' ``SafetensorError`` and
    torch.save's ``RuntimeError`` quote the OS error in their text only, Python's own writes
    raise an ``OSError`` with no file name when the disk fills after the open, and the tokenizers
    library raises a bare ``Exception`` ("No space left on device (os error 28)"). Each becomes an
    ``OSError`` naming ``path``."""
    try:
        yield path
    except OSError as e:
        if e.filename is not None:
            raise
        raise _unwritable(path, e.strerror or str(e), e.errno) from None
    except (SafetensorError, RuntimeError) as e:
        raise _unwritable(path, str(e)) from None
    except Exception as e:  # tokenizers' Rust errors are bare Exceptions: only an OS error is turned
        if "(os error " not in str(e):
            raise
        raise _unwritable(path, str(e)) from None


def _unwritable(path: Path, why: str, code: int | None = None) -> OSError:
    where = path if path.is_dir() else path.parent
    free = shutil.disk_usage(where).free // 1024 if where.is_dir() else "?"
    message = f"{path}: cannot be written ({why.strip()[:300]}; {free} KiB free on its disk)"
    error = OSError(message)  # one argument: str() is the message, no "[Errno 28]" before it
    error.errno = code
    return error


def load_checkpoint(ckpt: Path, policy: torch.nn.Module, critic: torch.nn.Module | None = None) -> TrainerState:
    """Restore weights, optimizer/scheduler and RNG states; returns the trainer state. The
    optimizer's hyper-parameters stay the recipe's (the engines were built from the config the
    resumed run records): a ``--resume RUN optim.lr=X`` trains at X from the resumed step on,
    its schedule included (:func:`_keep_configured`)."""
    rank, _ = rank_and_world()
    for name, eng in (("model", policy), ("critic", critic)):
        if eng is None:
            continue
        path = ckpt / f"{name}.safetensors"
        try:
            weights = load_file(str(path))
        except Exception as e:  # SafetensorError, OSError: one message naming the file
            raise CheckpointError(f"{path}: cannot be loaded ({type(e).__name__}: {e})") from None
        try:
            load_full_state_dict(eng, weights)
        except RuntimeError as e:  # torch's "size mismatch for ..." line per tensor: one sentence instead
            raise CheckpointError(_not_this_model(path, e)) from None
        with torch.serialization.safe_globals(_deepspeed_safe_globals()):
            opt = torch.load(ckpt / f"{name}_optim_rank{rank}.pt", weights_only=True)
        with _keep_configured(eng, name):
            _load_optimizer(eng, opt["optimizer"])
            if "scheduler" in opt and getattr(eng, "lr_scheduler", None) is not None:
                eng.lr_scheduler.load_state_dict(opt["scheduler"])
    state = read_state(ckpt)
    set_rng_state(state["rng"])
    return state


def _not_this_model(path: Path, e: RuntimeError) -> str:
    """A checkpoint whose tensors do not fit the model built from the recipe (another size, another
    architecture), said in one line: how many tensors differ and the first, not torch's line for
    each."""
    said = [ln.strip() for ln in str(e).splitlines()]
    lines = [ln for ln in said if ln.startswith(("size mismatch", "Missing", "Unexpected"))]
    first = lines[0].rstrip(".") if lines else str(e).splitlines()[0]
    n = sum(1 for ln in lines if ln.startswith("size mismatch"))
    many = f"{n} tensors differ in shape, the first: " if n > 1 else ""
    return (
        f"{path}: the checkpoint does not fit the model this recipe builds ({many}{first}); resume with the "
        "model the run was trained with (its config.json's model section), or start a new run"
    )


_HYPER = ("weight_decay", "betas")  # AdamW's per-group settings besides the LR (optim.weight_decay, optim.betas)


@contextlib.contextmanager
def _keep_configured(eng: Any, name: str) -> Iterator[None]:
    """Loading an optimizer's and a scheduler's state also loads the LR, weight decay and betas
    they were built with: put the engine's configured ones (this run's recipe) back after the
    block, the schedule's position (its step count) kept. The LR a group runs at is the
    configured base LR times the schedule's factor at the restored position (LambdaLR's
    ``base_lrs``, which its state carries too); without a schedule it is the configured LR."""
    groups = eng.optimizer.param_groups
    sched = getattr(eng, "lr_scheduler", None)
    base = list(sched.base_lrs) if sched is not None else [g["lr"] for g in groups]
    hyper = [{k: g[k] for k in _HYPER if k in g} for g in groups]
    yield
    groups = eng.optimizer.param_groups  # loading a state replaces the group dicts
    was = list(sched.base_lrs) if sched is not None else [g["lr"] for g in groups]
    for i, g in enumerate(groups):
        g.update(hyper[i])
        if sched is None:
            g["lr"] = base[i]
            continue
        g["initial_lr"] = base[i]
        g["lr"] = base[i] * sched.lr_lambdas[i](sched.last_epoch)
    if sched is not None:
        sched.base_lrs = base
        sched._last_lr = [g["lr"] for g in groups]  # what get_last_lr() reports until its next step
    if was != base:
        logger.info("%s: the checkpoint trained at LR %s; continuing at the recipe's %s", name, was, base)


def _load_optimizer(eng: Any, state: dict[str, Any]) -> None:
    """Load one rank's optimizer state into the engine's (possibly DeepSpeed-wrapped) optimizer.

    ZeRO and bf16 optimizers keep fp32 master weights and take a per-rank list; loading them
    from the fp32 copies (``load_from_fp32_weights``) makes the next step start from exactly the
    saved weights instead of their bf16 rounding.
    """
    stage = eng.zero_optimization_stage() if hasattr(eng, "zero_optimization_stage") else 0
    if stage == 0:
        eng.optimizer.load_state_dict(state)  # torch AdamW, or DeepSpeed's bf16 wrapper (restores fp32 copies)
        return
    rank, world = rank_and_world()
    per_rank: list[Any] = [None] * world  # DeepSpeed indexes it by the data-parallel rank
    per_rank[rank] = state
    eng.optimizer.load_state_dict(per_rank, load_optimizer_states=True, load_from_fp32_weights=True)


def _deepspeed_safe_globals() -> list[Any]:
    """The few plain DeepSpeed classes ZeRO optimizer states contain, allow-listed by name so
    ``weights_only`` loading still refuses everything else."""
    # deferred: optional extra (harness[train])
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def file_record(path: Path) -> dict[str, int | str]:
    """Size and sha256 of one checkpoint file (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def read_state(ckpt: Path) -> TrainerState:
    """A checkpoint's ``trainer_state.json``; :class:`CheckpointError` when unreadable."""
    try:
        state = json.loads((ckpt / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{ckpt / STATE_FILE}: unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{ckpt / STATE_FILE}: not a JSON object")
    return state


def verify_checkpoint(ckpt: Path) -> str | None:
    """None when every file the state records is there with its size and sha256; else what is wrong.

    Checkpoints written before sizes and hashes were recorded (no ``files``) are taken as they are.
    """
    try:
        files = read_state(ckpt).get("files")
    except CheckpointError as e:
        return str(e)
    for name, rec in (files or {}).items():
        p = ckpt / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != rec.get("size"):
            return f"{name} has {size} bytes, {rec.get('size')} were written"
        if file_record(p)["sha256"] != rec.get("sha256"):
            return f"{name} does not match its sha256"
    return None


def checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """``(step, dir)`` of every complete ``step-N`` directory (with a state file), oldest first."""
    return sorted(
        (int(p.name.split("-")[1]), p)
        for p in Path(out_dir).glob("step-*")
        if p.is_dir() and p.name.split("-")[1].isdigit() and (p / STATE_FILE).is_file()
    )


def latest_checkpoint(out_dir: Path, verify: bool = True) -> Path | None:
    """The newest complete, intact ``step-N`` directory (temporary ``.step-N.tmp`` ones are ignored).

    A damaged checkpoint (see :func:`verify_checkpoint`) is skipped with a warning naming it; when
    there are checkpoints and none is intact, :class:`CheckpointError` lists them. None: no
    checkpoint at all.
    """
    found = checkpoints(out_dir)
    if not verify:
        return found[-1][1] if found else None
    damaged: list[str] = []
    for _, ckpt in reversed(found):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            if damaged:
                logger.warning("falling back to %s (newer damaged: %s)", ckpt, "; ".join(damaged))
            return ckpt
        logger.warning("checkpoint %s is damaged: %s", ckpt, problem)
        damaged.append(f"{ckpt.name}: {problem}")
    if damaged:
        raise CheckpointError(f"no intact checkpoint under {out_dir}: " + "; ".join(damaged))
    return None


def export_hf(policy: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path) -> Path:
    """The trained policy as a Hugging Face model directory (safetensors + config + tokenizer)."""
    rank, _ = rank_and_world()
    weights = full_state_dict(policy)  # every rank (a collective under ZeRO-3)
    check_finite(weights, f"not writing the final model {out}")
    if rank == 0:
        with atomic_dir(out, kind="model") as tmp:
            with write_errors(out):
                unwrap(policy).save_pretrained(tmp, state_dict=weights, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    barrier()
    return out


def resume_checkpoint(
    run_dir: str | Path, policy: torch.nn.Module, critic: torch.nn.Module | None = None
) -> tuple[Path, TrainerState]:
    """Restore the newest intact checkpoint of the run ``run_dir`` (its ``checkpoints/``) into the
    engines; returns it and the trainer state. A run with no checkpoint is a FileNotFoundError.
    Nothing in the run folder is written: the trainer opens its records once the resumed run
    starts, dropping the log records after ``state["step"]`` then
    (:func:`training.logging_utils.open_run_records`; after a fallback past a damaged newest
    checkpoint those are more than one step's)."""
    where = Path(run_dir) / "checkpoints"
    ckpt = latest_checkpoint(where)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint under {where}")
    return ckpt, load_checkpoint(ckpt, policy, critic)


def save_position(
    trainer: Positioned, engine: torch.nn.Module, kind: str, tokenizer: PreTrainedTokenizerBase | None = None
) -> Path:
    """An SFT or PRM trainer's checkpoint of this step (:func:`save_and_prune` into
    ``trainer.out/checkpoints``, keeping ``cfg.trainer.keep_checkpoints``): ``engine``'s weights
    and, as trainer state, its ``kind``, the run id, the data position (``trainer.sampler``) and
    the non-finite guard's count; :func:`restore_position` reads that state back."""
    state = {
        "sampler": trainer.sampler.state(),
        "kind": kind,
        "run_id": trainer.run_id,
        "nonfinite": trainer.guard.state(),
    }
    keep = trainer.cfg.trainer.keep_checkpoints
    return save_and_prune(trainer.out / "checkpoints", trainer.step_no, engine, state, keep, tokenizer=tokenizer)


def restore_position(trainer: Positioned, state: TrainerState) -> None:
    """Put a trainer (RL, SFT, PRM) back where a checkpoint's ``state`` left it: its step
    (``step_no``, and ``_resumed``, from which its log drops the steps that run again), the run
    id (the same run, continued), the data position and the non-finite guard."""
    trainer.step_no = trainer._resumed = state["step"]
    trainer.run_id = state.get("run_id", trainer.run_id)
    trainer.sampler.load(state["sampler"])
    trainer.guard.load(state.get("nonfinite"))


def _state_of(ckpt: Path) -> TrainerState:
    """:func:`read_state`, or {} when unreadable (pruning goes on). Checkpoints written before run
    ids or interim flags lack those keys: no run id, and regular."""
    try:
        return read_state(ckpt)
    except CheckpointError:
        return {}


def last_good_checkpoint(found: list[tuple[int, Path]], first_nonfinite: int | None) -> Path | None:
    """Of ``found`` (step, path), the last checkpoint before the run's first non-finite step
    ``first_nonfinite`` whose weights a finite step then followed: step N's weights are what step
    N+1 ran on, so the checkpoint of the step just before is the one that gave the non-finite loss.
    None when the run has had no non-finite step or no checkpoint precedes it."""
    if first_nonfinite is None:
        return None
    before = [(s, p) for s, p in found if s < first_nonfinite - 1]
    return max(before)[1] if before else None


def divergence_advice(out_dir: Path, first_nonfinite: int | None) -> str:
    """What a diverged run's message says to do: resume from the last checkpoint before the first
    non-finite step (:func:`last_good_checkpoint`, named by path) at a lower LR, or, with none,
    train again with one."""
    lower = "a lower optim.lr (or optim.grad_clip)"
    found = checkpoints(out_dir)
    good = last_good_checkpoint(found, first_nonfinite)
    if good is None:
        return f"No checkpoint precedes the first non-finite step (step {first_nonfinite}): train again with {lower}"
    run = Path(out_dir).parent
    newer = [p.name for s, p in found if s > max(s for s, p in found if p == good)]
    how = f"--resume {run} optim.lr=X (a resumed run trains at the optim.* values given, the schedule's position kept)"
    if newer:
        how += f"; --resume continues from the newest checkpoint: move {', '.join(newer)} out of {out_dir} first"
    return (
        f"The last checkpoint before the first non-finite step (step {first_nonfinite}) is {good}: resume from it "
        f"with {lower}: {how}"
    )


def save_and_prune(
    out_dir: Path,
    step: int,
    policy: torch.nn.Module,
    state: TrainerState,
    keep: int,
    critic: torch.nn.Module | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    interim: bool = False,
) -> Path:
    """The checkpoint policy of every trainer (RL, SFT, PRM): write ``out_dir/step-N`` (see
    :func:`save_checkpoint`), then keep the newest ``keep`` checkpoints of this run (the new one
    included; 0 keeps all). ``state["run_id"]`` names the run: another run's checkpoints in the
    same folder are never pruned. Deletes go through :mod:`harness.safe_delete` (a checkpoint
    harness cannot prove it wrote is kept, with a warning).

    ``interim``: a checkpoint taken only to bound the work a kill loses (``save_every_minutes``
    between two ``save_every`` steps). It is only for resuming, so the next checkpoint of any kind
    replaces it, and it never counts towards ``keep``: the every-N-steps checkpoints a researcher
    evaluates are not pushed out by the clock's.

    Once the run has had a non-finite step (``state["nonfinite"]["first"]``, the guard's), the
    last checkpoint before it (:func:`last_good_checkpoint`) is never pruned: weights that blew up
    but stayed finite are checkpointed like any, and would otherwise push it out."""
    path = save_checkpoint(out_dir, step, policy, {**state, "interim": interim}, critic, tokenizer)
    rank, _ = rank_and_world()
    if keep and rank == 0:
        run_id = state.get("run_id")
        others = [(s, p, _state_of(p)) for s, p in checkpoints(out_dir) if p != path]  # each state read once
        mine = [(s, p, st) for s, p, st in others if st.get("run_id") == run_id]
        good = last_good_checkpoint([(s, p) for s, p, _ in mine], (state.get("nonfinite") or {}).get("first"))
        superseded = [p for s, p, st in mine if s < step and st.get("interim")]
        regular = [p for _, p, st in mine if not st.get("interim")]
        room = keep - (0 if interim else 1)  # a regular new checkpoint counts towards keep
        for old in superseded + regular[: max(0, len(regular) - room)]:
            if old == good:
                logger.info("keeping %s: the last checkpoint before the first non-finite step", old)
                continue
            try:
                safe_delete.remove(old, kind="checkpoint", why="trainer.keep_checkpoints")
            except safe_delete.NotOursError as e:
                logger.warning("%s; keeping it", e)
    return path
