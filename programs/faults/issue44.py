"""The faults of issue 44: user files under names that match harness's, a new learning rate on
--resume, chain files that are not chains, YAML keys that are not strings, values checked at the
door, a disk that fills at four more points of a training run."""

from __future__ import annotations

import json
from pathlib import Path

from programs.faults.battery import fault
from programs.faults.kit import (
    ALIAS_BOMB,
    HARNESS,
    eval_args,
    flat,
    harness,
    in_mount_namespace,
    namespaces_work,
    overwrite_with_user_files,
    refused_each,
    sft_recipe,
    sft_run,
)

# What a user keeps in a run folder under names that match harness's: --overwrite must refuse.
USER_FILES = {
    "console.log": "my console log",
    "checkpoints/.backup.tmp/model.safetensors": "my weights",
    "best-step-7/model.safetensors": "my model",
    "wandb/run-mine/notes.md": "my notes",
}


@fault(
    "train --overwrite on a run holding a console.log, checkpoints/.backup.tmp/, an unmarked best-step-7/, "
    "wandb/run-mine/ (issue 44)",
    "refused naming each, nothing deleted",
)
def overwrite_user_files(tmp: Path) -> tuple[bool, str]:
    outcome = overwrite_with_user_files(tmp, 1, USER_FILES)
    if isinstance(outcome, str):
        return False, outcome
    code, said, kept = outcome
    unnamed = [rel for rel in USER_FILES if rel not in said]
    ok = code != 0 and not unnamed and kept and "nothing was deleted" in said
    return ok, f"exit {code}; {'kept' if kept else 'DELETED'}; " + (
        f"unnamed: {unnamed}" if unnamed else "all four named"
    )


@fault("train --resume RUN optim.lr=0.5 after 2 steps at 1e-3 (issue 44)", "step 3 trains at 0.5, as recorded")
def resume_new_lr(tmp: Path) -> tuple[bool, str]:
    _, run, failed = sft_run(tmp, 2)
    if failed:
        return False, failed
    r = harness("train", "--resume", str(run), "trainer.max_steps=3", "optim.lr=0.5", cwd=tmp)
    lrs = {x["step"]: x.get("lr") for x in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    recorded = json.loads((run / "config.json").read_text())["optim"]["lr"]
    ok = r.returncode == 0 and lrs.get(3) == recorded == 0.5
    return ok, f"resume exit {r.returncode}; config.json lr {recorded}; step 3 trained at {lrs.get(3)}"


@fault(
    "a chain file with a key given twice, an alias bomb, a top-level list (issue 44)",
    "stages run / stages status / train --stages: exit 2 naming the file, no traceback",
)
def chain_yaml(tmp: Path) -> tuple[bool, str]:
    cases = {"twice": "name: x\nname: y\nstages: []\n", "bomb": ALIAS_BOMB, "list": "- a\n- b\n"}
    bad = []
    for name, text in cases.items():
        chain = tmp / f"{name}.yaml"
        chain.write_text(text)
        for command in (["stages", "run"], ["stages", "status"], ["train", "--stages"]):
            r = harness(*command, str(chain), cwd=tmp, timeout=120)
            said = flat(r.stdout + r.stderr)
            if r.returncode != 2 or str(chain) not in said or "Traceback" in said:
                bad.append(f"{name} {' '.join(command)}: exit {r.returncode} {said[-60:]}")
    return not bad, "; ".join(bad) or "9 refusals naming the file, no traceback"


@fault("keys YAML reads as no string (on:, 1:, ~:) in an eval config and a recipe (issue 44)", "named, exit 2")
def yaml_odd_keys(tmp: Path) -> tuple[bool, str]:
    cases = {}
    for i, text in enumerate(("on: 1\n", "judge:\n  1: x\n", "retriever:\n  ~: 1\n")):
        (tmp / f"e{i}.yaml").write_text(text)
        args = [*eval_args(tmp, tmp / "runs", "--retriever", "memory"), "-c", str(tmp / f"e{i}.yaml")]
        cases[f"eval {text.strip()}"] = (args, "YAML reads this key as", tmp / "runs")
    (tmp / "r.yaml").write_text("optim:\n  yes: 1\n")
    args = ["train", "-c", str(sft_recipe(tmp)), "-c", str(tmp / "r.yaml"), "--out", str(tmp / "run")]
    cases["recipe optim.yes"] = (args, "unknown config key true in 'optim'", tmp / "run")
    return refused_each(tmp, cases)


@fault(
    "judge.url: 5, judge.timeout: abc; optim.micro_batch_size=0, retriever.timeout=.inf / .nan (issue 44)",
    "refused naming the key, exit 2, no run folder",
)
def values_checked(tmp: Path) -> tuple[bool, str]:
    def ev(option: str) -> list[str]:
        return [*eval_args(tmp, tmp / "runs", "--retriever", "memory"), "metrics=[em,judge]", option]

    def tr(option: str) -> list[str]:
        return ["train", "-c", str(sft_recipe(tmp)), "--out", str(tmp / "run"), option]

    runs, run = tmp / "runs", tmp / "run"
    finite = "retriever.timeout: expected a finite"
    cases = {
        "judge.url": (ev("judge.url=5"), "judge.url must be an http(s):// endpoint", runs),
        "judge.timeout": (ev("judge.timeout=abc"), "judge.timeout: expected a number", runs),
        "retriever.timeout inf": (ev("retriever.timeout=.inf"), finite, runs),
        "micro_batch_size": (tr("optim.micro_batch_size=0"), "optim.micro_batch_size must be at least 1", run),
        "retriever.timeout nan": (tr("retriever.timeout=.nan"), finite, run),
    }
    return refused_each(tmp, cases)


@fault(
    "train on a disk that fills at 4 more points (the run's records, a checkpoint's files, its state, its "
    "tokenizer; issue 44)",
    "each message names a path, exit 2, no traceback",
)
def train_disk_points(tmp: Path) -> tuple[bool, str]:
    if not namespaces_work():
        return True, "skipped: no unprivileged mount namespaces here (unshare -rm)"
    recipe = sft_recipe(tmp)
    cli = " ".join((*HARNESS, "train", "-c", str(recipe), "trainer.max_steps=2", "trainer.save_every=1"))
    # tmpfs sizes where the tiny SFT run's disk fills: config.json, a checkpoint's config/tokenizer
    # files, trainer_state.json, the second checkpoint's tokenizer (measured on this recipe)
    sizes = ("8k", "128k", "360k", "520k")
    script = " ; ".join(
        f"mkdir -p {tmp}/d{s} && mount -t tmpfs -o size={s} tmpfs {tmp}/d{s} && {cli} --out {tmp}/d{s}/run; "
        f"echo EXIT $?"
        for s in sizes
    )
    r, codes, wrong = in_mount_namespace(script, 600, [])
    said = [ln for ln in flat(r.stderr).split("error: ")[1:]]
    unnamed = [m[:80] for m in said if str(tmp) not in m.split(";")[0]]
    ok = codes == ["2"] * len(sizes) and not wrong and len(said) == len(sizes) and not unnamed
    return ok, f"exits {codes}; {len(said)} messages" + (f"; unnamed: {unnamed}" if unnamed else ", each naming a path")
