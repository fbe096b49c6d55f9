"""The faults of issue 31: user files in a run's folders, a hand-written report, training that
diverges or resumes from damaged checkpoints, an async run's exit, read-only and full disks, the
retriever's breaker at full concurrency, failed items in the report, hostile YAML, paths that are
files or escape --out."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

from benchmarks import tiny_recipes
from programs.faults.battery import fault
from programs.faults.kit import (
    ALIAS_BOMB,
    HARNESS,
    RUN,
    RetrievalServer,
    eval_args,
    flat,
    harness,
    http,
    in_mount_namespace,
    namespaces_work,
    overwrite_with_user_files,
    refused_cleanly,
    sft_recipe,
    sft_run,
    snapshot,
)


@fault(
    "train --overwrite: user files in checkpoints/ and final/ of a harness run (issue 31)",
    "refused naming both paths, nothing deleted",
)
def overwrite_nested(tmp: Path) -> tuple[bool, str]:
    files = {"checkpoints/my_analysis.md": "notes\n", "final/exported_by_me/model.gguf": "GGUF"}
    outcome = overwrite_with_user_files(tmp, 2, files)
    if isinstance(outcome, str):
        return False, outcome
    code, out, untouched = outcome
    named = "checkpoints/my_analysis.md" in out and "final/exported_by_me/model.gguf" in out
    ok = code != 0 and named and untouched
    return ok, f"exit {code}; {'both named' if named else out[-90:]}; {'untouched' if untouched else 'CHANGED'}"


@fault("report --out over a hand-written leaderboard.md (issue 31)", "refused by name, nothing written")
def report_foreign_file(tmp: Path) -> tuple[bool, str]:
    ev = harness(*eval_args(tmp, tmp / "runs", "--retriever", "memory", "--limit", "2"), cwd=tmp)
    out = tmp / "report"
    out.mkdir()
    (out / "leaderboard.md").write_text("my own\n")
    r = harness("report", str(tmp / "runs" / RUN), "--out", str(out), cwd=tmp)
    said = flat(r.stdout + r.stderr)
    kept = (out / "leaderboard.md").read_text() == "my own\n" and sorted(p.name for p in out.iterdir()) == [
        "leaderboard.md"
    ]
    ok = ev.returncode == 0 and r.returncode == 2 and "leaderboard.md, which harness did not write" in said and kept
    return (
        ok,
        f"eval exit {ev.returncode}; report exit {r.returncode}; {'kept, nothing written' if kept else 'CHANGED'}",
    )


def finite_safetensors(folder: Path) -> bool:
    """Whether every tensor of every ``*.safetensors`` in ``folder`` is finite (and there is one)."""
    # deferred: torch costs ~1.4 s at import
    import torch
    from safetensors.torch import load_file

    files = list(folder.glob("*.safetensors"))
    return bool(files) and all(bool(torch.isfinite(t).all()) for f in files for t in load_file(str(f)).values())


@fault("train diverges: SFT at optim.lr=1e30, save_every=5, keep 2 (issue 31)", "exit 1 naming the step; no NaN saved")
def train_diverges(tmp: Path) -> tuple[bool, str]:
    run = tmp / "run"
    over = ["optim.lr=1e30", "trainer.max_steps=20", "trainer.save_every=5", "trainer.keep_checkpoints=2"]
    r = harness("train", "-c", str(sft_recipe(tmp)), "--out", str(run), *over, cwd=tmp)
    said = flat(r.stderr)
    named = re.search(r"diverged at step (\d+)", said)
    ckpts = sorted(p for p in (run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
    finite = all(finite_safetensors(p) for p in ckpts)
    ok = r.returncode == 1 and named is not None and finite and not (run / "final").exists()
    where = f"'diverged at step {named.group(1)}'" if named else said[-90:]
    return ok, f"exit {r.returncode}; {where}; checkpoints {[p.name for p in ckpts]} {'finite' if finite else 'NaN'}"


@fault("train --resume with every checkpoint damaged, new lr and steps (issue 31)", "exit 2; no run record changed")
def resume_fails(tmp: Path) -> tuple[bool, str]:
    _, run, failed = sft_run(tmp, 2)
    if failed:
        return False, failed
    for w in (run / "checkpoints").glob("step-*/model.safetensors"):
        w.write_bytes(w.read_bytes()[:1000])
    before = {k: v for k, v in snapshot(run).items() if not k.endswith(".harness.lock")}
    r = harness("train", "--resume", str(run), "trainer.max_steps=50", "optim.lr=0.5", cwd=tmp)
    after = {k: v for k, v in snapshot(run).items() if not k.endswith(".harness.lock")}
    said = flat(r.stderr)
    ok = r.returncode == 2 and "no intact checkpoint" in said and "Error:" not in said and after == before
    return ok, f"exit {r.returncode}; records {'unchanged' if after == before else 'CHANGED'}"


# One turn, 2 samples of 2 prompts a step, 2 steps, a checkpoint every step, rollouts overlapping training.
RL_RECIPE = tiny_recipes.grpo_recipe(
    "rl-fault",
    "rollout.sampling.max_new_tokens=16",
    "rollout.agent.max_total_tokens=400",
    "rollout.agent.max_doc_tokens=32",
    "optim.micro_batch_size=2",
    "optim.threads=1",
    "trainer.save_every=1",
    "trainer.async.enabled=true",
)


@fault("async train, then --resume (trainer.async; issue 31)", "both exit 0 (no abort at exit), final written")
def async_resume_exit(tmp: Path) -> tuple[bool, str]:
    (tmp / "rl.yaml").write_text(RL_RECIPE)
    run = tmp / "run"
    codes = []
    for args in (["-c", str(tmp / "rl.yaml"), "--out", str(run)], ["--resume", str(run), "trainer.max_steps=3"]):
        r = harness("train", *args, cwd=tmp)
        codes.append(r.returncode)
        if "terminate called" in r.stderr:
            codes[-1] = f"{r.returncode} (terminate called)"
    ok = codes == [0, 0] and (run / "final").is_dir()
    return ok, f"train exit {codes[0]}, resume exit {codes[1] if len(codes) > 1 else '-'}"


@fault(
    "train: --out a file / through a file, an invalid recipe (issue 31)",
    "messages naming the path, exit 2; no folder left",
)
def train_messages(tmp: Path) -> tuple[bool, str]:
    recipe = sft_recipe(tmp)
    (tmp / "a_file").write_text("x")
    cases = {
        "out is a file": (["--out", str(tmp / "a_file")], f"run folder {tmp / 'a_file'} is a file"),
        "out through a file": (["--out", str(tmp / "a_file" / "run")], f"{tmp / 'a_file' / 'run'}: Not a directory"),
        "invalid recipe": (["--out", str(tmp / "new" / "run"), "algo.kind=prm"], "needs prm.data"),
    }
    bad = []
    for name, (args, says) in cases.items():
        r = harness("train", "-c", str(recipe), *args, cwd=tmp)
        said = flat(r.stderr)
        if r.returncode != 2 or says not in said or "Traceback" in said or "Error:" in said:
            bad.append(f"{name}: exit {r.returncode} {said[-60:]}")
    if (tmp / "new").exists():
        bad.append("the invalid recipe left a folder")
    return not bad, "; ".join(bad) or "3 messages, exit 2, no folder left"


@fault("train on a read-only --out, --resume of a read-only run, a full disk (issue 31)", "messages naming the path")
def train_disks(tmp: Path) -> tuple[bool, str]:
    if not namespaces_work():
        return True, "skipped: no unprivileged mount namespaces here (unshare -rm)"
    recipe, run, failed = sft_run(tmp, 2)
    if failed:
        return False, failed
    ro, full = tmp / "ro", tmp / "full"
    ro.mkdir(), full.mkdir()
    cli = " ".join((*HARNESS, "train"))
    script = (
        f"mount -t tmpfs -o ro tmpfs {ro} && mount --bind {run} {run} && mount -o remount,bind,ro {run} && "
        f"mount -t tmpfs -o size=64k tmpfs {full} && "
        f"{cli} -c {recipe} --out {ro}/run; echo EXIT $?; {cli} --resume {run} trainer.max_steps=3; echo EXIT $?; "
        f"{cli} -c {recipe} --out {full}/run trainer.max_steps=2; echo EXIT $?"
    )
    expect = [
        f"cannot write {ro}/run: Read-only file system",
        f"cannot write {run}/.harness.lock: Read-only file system",
        "model.safetensors: cannot be written",
    ]
    _, codes, wrong = in_mount_namespace(script, 900, expect)
    ok = codes == ["2", "2", "2"] and not wrong
    return ok, f"exits {codes}; " + ("all three name the path" if not wrong else wrong[0][-70:])


@fault(
    "the retriever dies at the default concurrency (64) (issue 31)",
    "stops within 10 s of the breaker tripping, one pause, the count of failed items named",
)
def retriever_stop_time(tmp: Path) -> tuple[bool, str]:
    with RetrievalServer(fail_after=20) as server:  # HTTP 503 for good after 20 requests (each retried 3 times)
        args = eval_args(tmp, tmp / "runs", "--retriever", "http", "--index", server.url)
        args[args.index("--limit") + 1] = "154"  # every demo test question, 64 at a time (the default)
        r = harness(*args, cwd=tmp)
        ended = datetime.datetime.now()
    out = flat(r.stdout + r.stderr)
    trip = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING \S+: \d+ items in a row failed", r.stderr)
    pauses = len(re.findall(r"pausing \d+ s", r.stderr))
    named = re.search(r"retriever down: (\d+) items failed", out)
    if trip is None or named is None:
        return False, f"exit {r.returncode}; no trip or no count named: {out[-120:]}"
    took = (ended - datetime.datetime.strptime(trip.group(1), "%Y-%m-%d %H:%M:%S,%f")).total_seconds()
    ok = r.returncode == 1 and took < 10 and pauses == 1
    return ok, f"exit {r.returncode}; stopped {took:.1f} s after the trip; {pauses} pause(s); {named.group(0)}"


@fault("report vs eval on a run with failed items (issue 31)", "the same EM and n; an all-failed run shows no score")
def report_vs_eval(tmp: Path) -> tuple[bool, str]:
    shown = {}
    for fail_after, label in ((3, "some"), (1, "all")):  # the preflight (and two items) pass, then 503s
        with RetrievalServer(fail_after=fail_after) as server:
            harness(
                *eval_args(tmp, tmp / "runs", *http(server.url), "stop_after_failures=0", "--label", label), cwd=tmp
            )
    some = json.loads((tmp / "runs" / "some-demo-test" / "results.json").read_text())
    every = json.loads((tmp / "runs" / "all-demo-test" / "results.json").read_text())
    r = harness("report", str(tmp / "runs"), "--out", str(tmp / "report"), "--format", "md", cwd=tmp)
    md = (tmp / "report" / "leaderboard.md").read_text() if (tmp / "report" / "leaderboard.md").exists() else ""
    for label in ("some", "all"):
        row = next((x for x in md.splitlines() if x.startswith(f"| {label} |")), "")
        shown[label] = row.split("|")[2].strip() if row else "?"
    em = "–" if some["metrics"]["em"] is None else f"{100 * some['metrics']['em']:.1f}"
    want = f"({some['n']}/{some['n_total']}, {some['errors']} err)"
    ok = (
        r.returncode == 0
        and shown["some"].startswith(em + " ")
        and shown["some"].endswith(want)
        and every["metrics"]["em"] is None
        and shown["all"].startswith("– (")
    )
    return ok, f"results.json EM {em} n={some['n']}; report '{shown['some']}'; all failed: report '{shown['all']}'"


def _eval_with(tmp: Path, text: bytes, expect: str) -> tuple[bool, str]:
    (tmp / "c.yaml").write_bytes(text)
    args = [*eval_args(tmp, tmp / "runs", "--retriever", "memory"), "-c", str(tmp / "c.yaml")]
    return refused_cleanly(tmp, args, expect, lambda: not (tmp / "runs").exists())


@fault("an alias bomb under judge: in an eval config (issue 31)", "refused at once naming the file, no run folder")
def alias_bomb_eval(tmp: Path) -> tuple[bool, str]:
    text = "judge:\n" + "".join(f"  {x}\n" for x in ALIAS_BOMB.splitlines())
    return _eval_with(tmp, text.encode(), "c.yaml: its aliases (*name) expand to more than 100,000 values")


@fault("an alias bomb under a recipe's source values (issue 31)", "refused at once naming the file, no run folder")
def alias_bomb_recipe(tmp: Path) -> tuple[bool, str]:
    values = "".join(f"          {x}\n" for x in ALIAS_BOMB.splitlines())
    (tmp / "r.yaml").write_text(
        f"name: x\nalgo: {{kind: sft}}\nsft:\n  sources:\n    - kind: chat\n      values:\n{values}"
    )
    args = ["train", "-c", str(tmp / "r.yaml"), "--out", str(tmp / "run")]
    return refused_cleanly(tmp, args, "r.yaml: its aliases", lambda: not (tmp / "run").exists())


@fault("5,000 nested [ in an eval config (issue 31)", "a message naming the file, no RecursionError")
def yaml_nested(tmp: Path) -> tuple[bool, str]:
    return _eval_with(tmp, b"judge: " + b"[" * 5000, "c.yaml nests deeper than 100 levels")


@fault("judge: 5 in an eval config (issue 31)", "a message naming the key, no AttributeError")
def judge_not_a_mapping(tmp: Path) -> tuple[bool, str]:
    return _eval_with(tmp, b"judge: 5\n", "judge must be a mapping")


@fault("a Latin-1 eval config (issue 31)", "a message naming the file and the byte")
def yaml_not_utf8(tmp: Path) -> tuple[bool, str]:
    return _eval_with(tmp, "label: caf\xe9\n".encode("latin-1"), "c.yaml is not UTF-8 text (byte 10")


@fault("eval --out a file; a run folder path that is a file (issue 31)", "a message naming the file, both")
def out_is_a_file(tmp: Path) -> tuple[bool, str]:
    (tmp / "f").write_text("x")
    first = refused_cleanly(
        tmp, eval_args(tmp, tmp / "f", "--retriever", "memory"), f"{tmp / 'f'} is a file", lambda: True
    )
    (tmp / "runs").mkdir()
    (tmp / "runs" / RUN).write_text("x")
    second = refused_cleanly(
        tmp, eval_args(tmp, tmp / "runs", "--retriever", "memory"), f"{tmp / 'runs' / RUN} is a file", lambda: True
    )
    return first[0] and second[0], f"--out a file: {first[1][:60]}; run folder a file: {second[1][:60]}"


@fault("eval --split ../../x (issue 31)", "refused like a bad label; nothing outside --out")
def split_escapes(tmp: Path) -> tuple[bool, str]:
    (tmp / "data" / "hotpotqa").mkdir(parents=True)
    (tmp / "x.jsonl").write_text(json.dumps({"id": "q", "question": "Q?", "golden_answers": ["a"]}) + "\n")
    args = eval_args(
        tmp, tmp / "a" / "runs", "--retriever", "memory", "--split", "../../x", "--data-dir", str(tmp / "data")
    )
    args[args.index("demo")] = "hotpotqa"
    before = sorted(p.name for p in tmp.iterdir())
    return refused_cleanly(
        tmp, args, "dataset.split '../../x'", lambda: sorted(p.name for p in tmp.iterdir()) == before
    )


@fault("eval on a read-only --out, and a disk that fills mid-run (issue 31)", "messages naming the path; data kept")
def eval_disks(tmp: Path) -> tuple[bool, str]:
    if not namespaces_work():
        return True, "skipped: no unprivileged mount namespaces here (unshare -rm)"
    ro, full = tmp / "ro", tmp / "full"
    ro.mkdir(), full.mkdir()
    cli = " ".join((*HARNESS, *(f"'{a}'" for a in eval_args(tmp, Path("OUT"), "--retriever", "memory"))))
    script = (
        f"mount -t tmpfs -o ro tmpfs {ro} && mount -t tmpfs -o size=48k tmpfs {full} && "
        f"{cli.replace('OUT', str(ro))}; echo EXIT $?; {cli.replace('OUT', str(full))}; echo EXIT $?; "
        f"wc -l < {full}/{RUN}/scores.jsonl; echo LINES"
    )
    expect = [f"{ro}/{RUN} is on a read-only file system; pick another --out", "the disk is full (writing"]
    r, codes, wrong = in_mount_namespace(script, 600, expect)
    kept = re.search(r"(\d+)\s+LINES", r.stdout)
    ok = codes == ["2", "2"] and not wrong and kept is not None and int(kept.group(1)) > 0
    lines = kept.group(1) if kept else "?"
    return ok, f"exits {codes}; " + (f"both name the path; {lines} items kept" if not wrong else wrong[0][-60:])
