"""Harness deletes only what it wrote (issue 23, defect 1): every delete path goes through
``harness.safe_delete``, which needs the marker harness writes when it creates a folder and
refuses, by name, anything else. The issue's reproduction (a project folder with ``config.json``
and ``src/main.py`` given to ``harness train --out P --overwrite``) leaves the folder untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.tiny_recipes import sft_recipe
from cli.main import app
from harness import safe_delete
from harness.fsutil import atomic_dir
from harness.runlog import RUN_ENTRIES
from harness.safe_delete import MARKER, NotOursError, check_removable, claim, clear, remove
from programs.faults.kit import foreign_project, snapshot

runner = CliRunner()


def test_train_overwrite_refuses_a_foreign_folder_and_leaves_it_untouched(tmp_path):
    p = foreign_project(tmp_path)
    before = snapshot(p)
    res = runner.invoke(
        app,
        [
            "train",
            "-c",
            "configs/train/smollm2_cpu_sft_demo.yaml",
            "--out",
            str(p),
            "--overwrite",
            "trainer.max_steps=1",
        ],
    )
    out = " ".join(res.output.split())
    assert res.exit_code != 0
    assert "was not created by harness" in out and "config.json, src/" in out and "nothing was deleted" in out
    assert snapshot(p) == before and sorted(x.name for x in p.iterdir()) == ["config.json", "src"]  # not even a lock


def test_index_build_refuses_to_replace_a_foreign_folder(tmp_path):
    from benchmarks.datasets import demo_path

    p = foreign_project(tmp_path)
    before = snapshot(p)
    res = runner.invoke(app, ["index", "build", "--corpus", str(demo_path("corpus.jsonl")), "--out", str(p)])
    assert res.exit_code != 0 and "was not created by harness" in " ".join(res.output.split())
    assert snapshot(p) == before
    # its own index is replaced by a rebuild (marked at commit with what it held)
    idx = tmp_path / "idx"
    for _ in range(2):
        res = runner.invoke(app, ["index", "build", "--corpus", str(demo_path("corpus.jsonl")), "--out", str(idx)])
        assert res.exit_code == 0, res.output
    assert safe_delete.read_marker(idx)["kind"] == "index"


def test_overwrite_clears_a_harness_run_but_names_what_it_did_not_write(tmp_path):
    from training.build import TRAIN_ENTRIES, claim_run_folder

    run = tmp_path / "run"
    assert claim(run, "train")
    assert claim(run / "checkpoints" / "step-1", "checkpoint")  # a checkpoint folder carries its marker
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(NotOursError, match=r"holds notes\.txt, which harness did not write there; nothing was deleted"):
        claim_run_folder(run, overwrite=True)
    assert (run / "checkpoints" / "step-1").is_dir() and (run / "config.json").exists()  # all or nothing
    (run / "notes.txt").unlink()
    with pytest.raises(ValueError, match="not empty .*--overwrite"):
        claim_run_folder(run, overwrite=False)
    claim_run_folder(run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [MARKER]
    assert check_removable(run, TRAIN_ENTRIES, kind="train") == []


def test_a_fresh_run_folder_being_claimed_by_rank_0_is_still_empty_to_the_other_ranks(tmp_path):
    """Rank 0 marks and locks the folder while the other ranks check it is empty: what it writes
    meanwhile (the marker, its temporary, the lock) is not output (a two-rank launch failed on it)."""
    from training.build import claim_run_folder

    run = tmp_path / "run"
    run.mkdir()
    (run / f".{MARKER}.tmp-12345").write_text("{}")  # rank 0's marker, half written
    (run / ".harness.lock").write_text("")
    claim_run_folder(run)
    claim(run, "train")
    claim_run_folder(run)
    (run / ".config.json.tmp-1").write_text("{}")  # any other temporary is a run's output
    with pytest.raises(ValueError, match=r"not empty \(\.config\.json\.tmp-1\)"):
        claim_run_folder(run)


def test_the_guard_needs_a_marker_the_right_kind_and_only_known_names(tmp_path):
    unmarked = tmp_path / "unmarked"
    unmarked.mkdir()
    (unmarked / "manifest.json").write_text("{}")
    with pytest.raises(NotOursError, match="not created by harness"):
        clear(unmarked, RUN_ENTRIES)
    with pytest.raises(NotOursError, match="not created by harness"):
        remove(unmarked, RUN_ENTRIES)
    assert (unmarked / "manifest.json").exists()

    run = tmp_path / "run"
    claim(run, "eval")
    (run / "manifest.json").write_text("{}")
    with pytest.raises(NotOursError, match="'eval' output, not a 'train' one"):
        clear(run, RUN_ENTRIES, kind="train")
    assert clear(run, RUN_ENTRIES, kind="eval") == ["manifest.json"]
    assert remove(run, RUN_ENTRIES, kind="eval") and not run.exists()

    # a file or a link is never taken for a folder of ours
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotOursError, match="a file or a link"):
        clear(tmp_path / "f")
    (tmp_path / "link").symlink_to(unmarked)
    with pytest.raises(NotOursError, match="a file or a link"):
        remove(tmp_path / "link")
    assert (unmarked / "manifest.json").exists()

    # claim never marks a folder that already holds something (a run from before markers)
    assert not claim(unmarked, "eval") and safe_delete.read_marker(unmarked) is None


def test_atomic_dir_replaces_only_its_own_output(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out, kind="model") as tmp:
        (tmp / "model.safetensors").write_text("v1")
    marker = json.loads((out / MARKER).read_text())
    assert marker["kind"] == "model" and marker["entries"] == ["model.safetensors"]
    with atomic_dir(out, kind="model") as tmp:
        (tmp / "model.safetensors").write_text("v2")
    assert (out / "model.safetensors").read_text() == "v2"
    (out / "README.md").write_text("added by the user")
    with pytest.raises(NotOursError, match="README.md"), atomic_dir(out, kind="model") as tmp:
        (tmp / "model.safetensors").write_text("v3")
    assert (out / "model.safetensors").read_text() == "v2" and (out / "README.md").exists()
    assert not list(tmp_path.glob(".out.tmp*"))  # the temporary copy went, the output stayed


def test_eval_run_dirs_are_marked_and_demo_refuses_a_foreign_one(tmp_path):
    from harness.run_records import RunManifest
    from harness.runlog import RunDir

    rd = RunDir(tmp_path / "r")
    rd.open(RunManifest(method="m", dataset="d", split="s"))
    assert safe_delete.read_marker(rd.path)["kind"] == "eval"
    assert remove(rd.path, RUN_ENTRIES, kind="eval", why="harness demo")
    p = foreign_project(tmp_path)
    with pytest.raises(NotOursError):
        remove(p, RUN_ENTRIES, kind="eval", why="harness demo")
    assert (p / "src" / "main.py").exists()


def tiny_sft_run(tmp_path: Path) -> tuple[Path, Path]:
    """A training run made by ``harness train`` (a tiny SFT, two checkpoints and ``final/``)."""
    recipe = sft_recipe(tmp_path, "trainer.max_steps=2", name="sft-nested")
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", "-c", str(recipe), "--out", str(run)])
    assert res.exit_code == 0, res.output
    assert (run / "final").is_dir() and (run / "checkpoints" / "step-2").is_dir()
    return recipe, run


def test_overwrite_refuses_user_files_inside_harness_named_subfolders(tmp_path):
    """Issue 31 defect 2: a file the user put inside ``checkpoints/`` and one inside a folder of
    their own in ``final/`` are named by path, and nothing at all is deleted."""
    recipe, run = tiny_sft_run(tmp_path)
    (run / "checkpoints" / "my_analysis.md").write_text("my notes")
    (run / "final" / "exported_by_me").mkdir()
    (run / "final" / "exported_by_me" / "model.gguf").write_bytes(b"GGUF")
    before = snapshot(run)
    res = runner.invoke(app, ["train", "-c", str(recipe), "--out", str(run), "--overwrite"])
    out = " ".join(res.output.split())
    assert res.exit_code != 0
    assert "checkpoints/my_analysis.md" in out and "final/exported_by_me/model.gguf" in out, out
    assert "nothing was deleted" in out
    assert snapshot(run) == before
    # without them, the same --overwrite clears the run and trains again
    (run / "checkpoints" / "my_analysis.md").unlink()
    shutil.rmtree(run / "final" / "exported_by_me")
    res = runner.invoke(app, ["train", "-c", str(recipe), "--out", str(run), "--overwrite"])
    assert res.exit_code == 0, res.output


def test_the_guard_proves_every_depth(tmp_path):
    """Files added to a committed folder, a checkpoint folder without its marker, a file where a
    folder belongs and a marker of another kind are each refused by path."""
    from training.build import TRAIN_ENTRIES

    run = tmp_path / "run"
    claim(run, "train")
    with atomic_dir(run / "checkpoints" / "step-1", kind="checkpoint") as tmp:
        (tmp / "model.safetensors").write_text("w")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "part.bin").write_text("w")
    assert safe_delete.read_marker(run / "checkpoints" / "step-1")["entries"] == [
        "model.safetensors",
        "sub",
        "sub/part.bin",
    ]
    assert check_removable(run, TRAIN_ENTRIES, kind="train") == [run / "checkpoints"]
    cases = {
        "checkpoints/step-1/extra.txt": lambda: (run / "checkpoints" / "step-1" / "extra.txt").write_text("x"),
        "checkpoints/step-1/sub/mine.txt": lambda: (run / "checkpoints" / "step-1" / "sub" / "mine.txt").write_text(
            "x"
        ),
        "checkpoints/step-2/model.safetensors": lambda: (
            (run / "checkpoints" / "step-2").mkdir(),
            (run / "checkpoints" / "step-2" / "model.safetensors").write_text("w"),
        ),
        "tensorboard/notes.txt": lambda: (
            (run / "tensorboard").mkdir(),
            (run / "tensorboard" / "notes.txt").write_text("x"),
        ),
        "metrics.jsonl/": lambda: (run / "metrics.jsonl").mkdir(),
        "validation/step-1/x/ (a harness 'train' output where a 'eval' one belongs)": lambda: (
            (run / "validation" / "step-1" / "x").mkdir(parents=True),
            claim(run / "validation" / "step-1" / "x", "train"),
            (run / "validation" / "step-1" / "x" / "manifest.json").write_text("{}"),
        ),
    }
    for path, add in cases.items():
        add()
        with pytest.raises(NotOursError) as e:
            check_removable(run, TRAIN_ENTRIES, kind="train")
        assert path in str(e.value), (path, str(e.value))
    before = snapshot(run)
    with pytest.raises(NotOursError):
        clear(run, TRAIN_ENTRIES, kind="train")
    assert snapshot(run) == before


def test_claim_takes_a_folder_holding_only_bookkeeping_and_names_another_kind(tmp_path):
    """``claim`` counted a leftover marker temporary as output (it used the two fixed names, not
    :func:`safe_delete.bookkeeping`), leaving a fresh folder unmarked: never clearable."""
    run = tmp_path / "run"
    run.mkdir()
    (run / f".{MARKER}.tmp-999").write_text("{")
    assert claim(run, "eval") and safe_delete.read_marker(run)["kind"] == "eval"
    assert not claim(run, "train")  # marked, but as another kind of output


def test_the_not_empty_hint_offers_overwrite_only_where_it_would_succeed(tmp_path):
    """Issue 31 defect 11: the hint suggested --overwrite for folders --overwrite refuses."""
    from training.build import claim_run_folder

    p = foreign_project(tmp_path)
    with pytest.raises(ValueError, match="not empty") as e:
        claim_run_folder(p)
    assert "--overwrite" not in str(e.value) and "pick another --out" in str(e.value)
    run = tmp_path / "run"
    claim(run, "train")
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="replace it with --overwrite"):
        claim_run_folder(run)


# Issue 44 defect 1: what a user makes under names that match harness's patterns. Each is added to
# a real run folder (``harness train``), and ``--overwrite`` must refuse by path, deleting nothing.
USER_FILES_NAMED_LIKE_OURS = {
    "console.log": "my console log",  # a top-level log harness never writes
    "checkpoints/.backup.tmp/model.safetensors": "my weights",  # not a temporary of a checkpoint's name
    "best-step-7/model.safetensors": "my model",  # a model folder with no harness marker
    ".notes.tmp": "my notes",
    "wandb/run-mine/notes.md": "my notes",  # not a W&B run folder name
    "tensorboard/events.out.tfevents.mine": "my events",
    "rollouts.jsonl": '{"mine": 1}\n',  # an SFT run writes no rollouts
    "value_head.safetensors": "my head",  # nor a value head (a retriever PPO run does)
    "validation/step-0/mine/manifest.json": "{}",  # an eval run folder with no marker
    "engines/mine.log": "my log",  # not an engine log name
}


@pytest.mark.parametrize("rel", list(USER_FILES_NAMED_LIKE_OURS))
def test_overwrite_spares_user_files_named_like_harness_output(tmp_path, rel):
    recipe, run = tiny_sft_run(tmp_path)
    (run / rel).parent.mkdir(parents=True, exist_ok=True)
    (run / rel).write_text(USER_FILES_NAMED_LIKE_OURS[rel])
    before = snapshot(run)
    res = runner.invoke(app, ["train", "-c", str(recipe), "--out", str(run), "--overwrite"])
    out = " ".join(res.output.split())
    assert res.exit_code != 0, out
    assert rel in out and "nothing was deleted" in out, out
    assert snapshot(run) == before


def test_overwrite_still_clears_what_harness_writes_under_those_names(tmp_path):
    """The tightened names still cover harness's own: temporaries of its entries, engine logs,
    TensorBoard event files, W&B run folders, marked model folders and recorded rollouts."""
    from training.build import TRAIN_ENTRIES
    from training.logging_utils import MetricsLog

    run = tmp_path / "run"
    claim(run, "train")
    claim(run / "validation" / "step-2" / "search_r1-demo-val", "eval")  # as harness.runlog does
    ours = {
        ".final.tmp/model.safetensors": "w",  # an export cut short (harness.fsutil.tmp_sibling)
        ".metrics.jsonl.tmp": "x",
        "checkpoints/.step-3.tmp/model.safetensors": "w",
        "checkpoints/.step-4.tmp-123/model.safetensors": "w",
        "sglang-30000.log": "x",  # an engine launched by a training run (older runs wrote it here)
        "engines/vllm-8000.log": "x",
        "tensorboard/events.out.tfevents.1712345678.host.123.0": "x",
        "wandb/run-20240101_120000-abc123/files/output.log": "x",
        "wandb/debug-internal.log": "x",
        "validation/step-2/search_r1-demo-val/.manifest.json.tmp-77": "x",
    }
    for rel, text in ours.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    with atomic_dir(run / "best-step-7", kind="model") as tmp:
        (tmp / "model.safetensors").write_text("w")
    (run / "config.json").write_text(json.dumps({"algo": {"kind": "rl"}}))  # an RL run: its rollouts are ours
    MetricsLog(run, tensorboard=False).write_rollouts(1, [], [], [])
    assert sorted(clear(run, TRAIN_ENTRIES, kind="train")) == sorted(
        {Path(r).parts[0] for r in ours} | {"best-step-7", "rollouts.jsonl", "config.json"}
    )
