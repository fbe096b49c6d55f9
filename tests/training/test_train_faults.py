"""``harness train`` under faults (issue 31, defects 3, 5, 8 and 11): a failed ``--resume`` and an
invalid recipe write nothing, and an unwritable, read-only or full disk is a message naming the
path (exit 2), never a traceback or an exception's class name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.ports import child_env
from programs.faults.kit import namespaces_work
from tests.training.test_divergence import sft_recipe

REPO = Path(__file__).resolve().parents[2]


def train(*args: str) -> tuple[int, str]:
    from cli.main import app

    res = CliRunner().invoke(app, ["train", *args])
    return res.exit_code, " ".join(res.output.split())


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but the run lock (each holder writes its pid and time there)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != ".harness.lock")
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


@pytest.mark.slow  # one short SFT run, then two refused resumes (~10 s)
def test_a_failed_resume_rewrites_no_run_record(tmp_path):
    """Every checkpoint damaged: the resume used to exit 2 but leave config.json saying lr 0.5 and 50
    steps for weights trained at 0.001 for 2. And a folder harness never wrote is left as it was."""
    recipe, run = sft_recipe(tmp_path), tmp_path / "run"
    code, out = train("-c", str(recipe), "--out", str(run), "trainer.max_steps=2", "trainer.save_every=1")
    assert code == 0, out
    for w in (run / "checkpoints").glob("step-*/model.safetensors"):
        w.write_bytes(w.read_bytes()[:1000])
    before = snapshot(run)
    code, out = train("--resume", str(run), "trainer.max_steps=50", "optim.lr=0.5")
    assert code == 2 and "no intact checkpoint" in out and "CheckpointError" not in out, out
    assert snapshot(run) == before

    foreign = tmp_path / "mine"
    (foreign / "checkpoints").mkdir(parents=True)
    (foreign / "config.json").write_text('{"my": "notes"}')
    (foreign / "checkpoints" / "step-1").mkdir()
    (foreign / "checkpoints" / "step-1" / "weights.bin").write_bytes(b"x")
    code, out = train("-c", str(recipe), "--resume", str(foreign), "trainer.max_steps=50")
    assert code == 2 and f"no checkpoint under {foreign / 'checkpoints'}" in out, out
    assert "FileNotFoundError" not in out
    assert (foreign / "config.json").read_text() == '{"my": "notes"}'
    assert sorted(p.name for p in foreign.iterdir() if not p.name.startswith(".")) == ["checkpoints", "config.json"]


@pytest.mark.parametrize(
    "kind, overrides, says",
    [
        ("sft", ["sft.sources=[{kind: chat, path: /nonexistent/chat.jsonl}]"], "/nonexistent/chat.jsonl"),
        ("sft", ["algo.kind=prm"], "needs prm.data"),
        ("rl", ["algo.critic_warmup=2"], "algo.critic_warmup=2 needs a critic"),
    ],
)
def test_an_invalid_recipe_claims_no_run_folder(tmp_path, kind, overrides, says):
    """The recipe is checked, its data and model built, before the run folder is created, locked or
    claimed: a failure used to leave a claimed (marked, locked) folder behind."""
    from tests.training.rl.test_trainer import recipe as rl_recipe

    f = sft_recipe(tmp_path) if kind == "sft" else rl_recipe(tmp_path)
    run = tmp_path / "out" / "run"
    code, out = train("-c", str(f), "--out", str(run), *overrides)
    assert code == 2 and says in out, out
    assert not (tmp_path / "out").exists()


def test_an_unknown_registry_name_is_its_message_not_a_key_error(tmp_path):
    """A registry's error is a KeyError: it used to print as 'KeyError: "unknown reward ..."'."""
    from tests.training.rl.test_trainer import recipe as rl_recipe

    code, out = train("-c", str(rl_recipe(tmp_path)), "--out", str(tmp_path / "run"), "algo.reward=nope")
    assert code == 2 and "error: unknown reward 'nope'" in out and "KeyError" not in out, out
    assert not (tmp_path / "run").exists()


def test_an_out_that_is_a_file_is_a_message(tmp_path):
    f = sft_recipe(tmp_path)
    (tmp_path / "a_file").write_text("x")
    code, out = train("-c", str(f), "--out", str(tmp_path / "a_file"))
    assert code == 2 and f"run folder {tmp_path / 'a_file'} is a file" in out, out
    code, out = train("-c", str(f), "--out", str(tmp_path / "a_file" / "run"))
    assert code == 2 and f"{tmp_path / 'a_file' / 'run'}: Not a directory" in out, out
    assert (tmp_path / "a_file").read_text() == "x"


# Run inside a private mount namespace (nothing outside it sees the mounts): a read-only tmpfs,
# a read-only bind of a trained run, and two tiny tmpfs that fill up during the first checkpoint
# (64 KiB: in model.safetensors; 200 KiB: in the optimizer state).
FAULTS = r"""
import json, logging, sys
from typer.testing import CliRunner
from cli.main import app
recipe, ro, run, full, fuller = sys.argv[1:]
cases = {
    "read-only --out": ["-c", recipe, "--out", ro + "/run"],
    "read-only --resume": ["--resume", run, "trainer.max_steps=3"],
    "disk full in the weights": ["-c", recipe, "--out", full + "/run", "trainer.max_steps=2"],
    "disk full in the optimizer state": ["-c", recipe, "--out", fuller + "/run", "trainer.max_steps=2"],
}
out = {}
for name, args in cases.items():
    logging.getLogger().handlers.clear()  # the last invocation's handler writes to a closed stream
    r = CliRunner().invoke(app, ["train", *args])
    out[name] = [r.exit_code, " ".join(r.output.split()), repr(r.exception) if r.exit_code not in (0, 2) else ""]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow  # one SFT run, then four refused ones in a mount namespace (~25 s)
@pytest.mark.skipif(not namespaces_work(), reason="needs unprivileged mount namespaces (unshare -rm)")
def test_read_only_and_full_disks_are_messages_naming_the_path(tmp_path):
    recipe, run = sft_recipe(tmp_path), tmp_path / "run"
    code, out = train("-c", str(recipe), "--out", str(run), "trainer.max_steps=2", "trainer.save_every=1")
    assert code == 0, out
    ro, full, fuller = tmp_path / "ro", tmp_path / "full", tmp_path / "fuller"
    for d in (ro, full, fuller):
        d.mkdir()
    before = snapshot(run)
    mounts = (
        f"mount -t tmpfs -o ro tmpfs {ro} && mount --bind {run} {run} && mount -o remount,bind,ro {run} && "
        f"mount -t tmpfs -o size=64k tmpfs {full} && mount -t tmpfs -o size=200k tmpfs {fuller}"
    )
    script = tmp_path / "faults.py"
    script.write_text(FAULTS)
    cmd = f'{mounts} && exec "{sys.executable}" {script} {recipe} {ro} {run} {full} {fuller}'
    # a process group of its own (this process's port, set by an earlier in-process training, is taken)
    env = child_env()
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, proc.stderr[-2000:]
    got = json.loads(lines[0][len("RESULT ") :])
    expect = {
        "read-only --out": f"cannot write {ro}/run: Read-only file system",
        "read-only --resume": f"cannot write {run}/.harness.lock: Read-only file system",
        "disk full in the weights": f"{full}/run/checkpoints/.step-2.tmp/model.safetensors: cannot be written",
        "disk full in the optimizer state": f"{fuller}/run/checkpoints/.step-2.tmp/model_optim_rank0.pt: cannot be",
    }
    for name, says in expect.items():
        code, out, exc = got[name]
        message = out[out.index("error: ") :] if "error: " in out else out
        assert code == 2 and says in message and "Traceback" not in out, (name, message, exc)
    assert "No space left on device" in got["disk full in the weights"][1]
    assert snapshot(run) == before  # the read-only resume changed nothing
