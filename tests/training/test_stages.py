"""Stage chains: placeholders resolve (and wrong ones are named), stages run in order and feed
each other, a rerun runs nothing finished, a failure stops the chain and is resumed with the
stage's rerun_args, a changed upstream makes downstream outputs stale, and a real two-stage
chain (eval K samples → rft-filter) runs through ``harness stages run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from training.stages import StageError, load_chain, run_chain, stage_state

runner = CliRunner()

CHAIN = """
name: toy
workdir: {workdir}
vars: {{size: "3", tag: "t-{{workdir}}"}}
stages:
  - name: first
    command: data make
    args: [--n, "{{vars.size}}"]
    output: "{{workdir}}/first.txt"
  - name: second
    command: train
    args: [--in, "{{stage.first.output}}"]
    set: ["sft.sources=[{{kind: run, path: x}}]"]
    output: "{{workdir}}/second"
    rerun_args: [--overwrite]
  - name: third
    command: eval
    args: [--in, "{{stage.second.output}}/final"]
    output: "{{workdir}}/third.txt"
"""


def write_chain(tmp_path: Path, text: str = CHAIN) -> Path:
    p = tmp_path / "chain.yaml"
    p.write_text(text.format(workdir=tmp_path / "work"))
    return p


class Executor:
    """Plays the harness: writes each stage's --out (a file, or a folder with final/), fails on demand."""

    def __init__(self, fail_on: str | None = None, write: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.fail_on, self.write = fail_on, write

    def __call__(self, argv: list[str], log: Path) -> int:
        self.calls.append(argv)
        if self.fail_on and self.fail_on in argv:
            return 3
        out = Path(argv[argv.index("--out") + 1])
        if self.write:
            if argv[0] == "train":
                (out / "final").mkdir(parents=True, exist_ok=True)
            else:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(" ".join(argv))
        return 0


def test_placeholders_resolve_and_braces_of_yaml_flow_are_left_alone(tmp_path):
    ch = load_chain(write_chain(tmp_path), variables={"size": "5"})
    work = str(tmp_path / "work")
    assert ch.names == ["first", "second", "third"]
    assert ch.stage("first").argv == ("data", "make", "--n", "5", "--out", f"{work}/first.txt")
    second = ch.stage("second")
    assert second.args == ("--in", f"{work}/first.txt") and second.set == ("sft.sources=[{kind: run, path: x}]",)
    assert second.argv[-1] == "sft.sources=[{kind: run, path: x}]" and second.command == ("train",)
    assert ch.stage("third").argv[2] == f"{work}/second/final"
    assert ch.vars["tag"] == f"t-{work}"
    assert load_chain(write_chain(tmp_path), workdir="elsewhere").stage("second").output == "elsewhere/second"


@pytest.mark.parametrize(
    "bad, message",
    [
        ('"{{stage.third.output}}"', "unknown placeholder {stage.third.output}"),  # a later stage
        ('"{{vars.nope}}"', "unknown placeholder {vars.nope}"),
        ('"{{workdri}}"', "unknown placeholder {workdri}"),
    ],
)
def test_wrong_placeholders_are_named(tmp_path, bad, message):
    text = CHAIN.replace('"{{vars.size}}"', bad)
    with pytest.raises(StageError, match=message.replace("{", r"\{").replace("}", r"\}")) as e:
        load_chain(write_chain(tmp_path, text))
    assert "stages[0] (first)" in str(e.value)


def test_bad_chains_are_refused_with_where(tmp_path):
    with pytest.raises(StageError, match="command must be a harness stage command"):
        load_chain(write_chain(tmp_path, CHAIN.replace("command: data make", "command: rm make")))
    with pytest.raises(StageError, match="set: each item is key=value"):
        load_chain(write_chain(tmp_path, CHAIN.replace('["sft.sources', '[--overwrite, "sft.sources')))
    with pytest.raises(StageError, match="missing output"):
        load_chain(write_chain(tmp_path, CHAIN.replace('    output: "{{workdir}}/first.txt"\n', "")))
    with pytest.raises(StageError, match="no var 'sz'"):
        load_chain(write_chain(tmp_path), variables={"sz": "1"})
    with pytest.raises(StageError, match="unique"):
        load_chain(write_chain(tmp_path, CHAIN.replace("name: third", "name: first")))


def test_runs_in_order_then_nothing_then_resumes_a_failed_stage(tmp_path):
    ch = load_chain(write_chain(tmp_path))
    ex = Executor(fail_on="train")
    with pytest.raises(StageError, match=r"stage 'second' failed \(exit status 3\).*second\.log"):
        run_chain(ch, ex)
    assert [c[0] for c in ex.calls] == ["data", "train"]  # third never started
    assert [stage_state(ch, s) for s in ch.stages] == ["done", "partial", "todo"]

    ex = Executor()
    outcomes = run_chain(ch, ex)
    assert [c[0] for c in ex.calls] == ["train", "eval"]  # first is not run again
    assert ex.calls[0][-1] == "--overwrite"  # the failed stage reruns with its rerun_args
    assert [(o.name, o.ran, o.state_before) for o in outcomes] == [
        ("first", False, "done"),
        ("second", True, "partial"),
        ("third", True, "todo"),
    ]
    marker = json.loads((tmp_path / "work" / ".stages" / "third.json").read_text())
    assert marker["state"] == "done" and marker["argv"][:2] == ["harness", "eval"]
    assert set(marker["upstream"]) == {"first", "second"}

    ex = Executor()
    assert not any(o.ran for o in run_chain(ch, ex)) and ex.calls == []


def test_a_rerun_upstream_makes_downstream_stale(tmp_path):
    ch = load_chain(write_chain(tmp_path))
    run_chain(ch, Executor())
    (tmp_path / "work" / "first.txt").unlink()  # the user wants stage one again
    (tmp_path / "work" / "second" / "old-artifact").write_text("from the old upstream")
    assert stage_state(ch, ch.stage("first")) == "todo"
    ex = Executor()
    outcomes = run_chain(ch, ex)
    assert [c[0] for c in ex.calls] == ["data", "train", "eval"]
    assert "--overwrite" not in ex.calls[1]  # stale: moved aside and run afresh, not resumed
    assert not (tmp_path / "work" / "second" / "old-artifact").exists()
    # ... moved aside, never deleted, and the outcome says where
    (aside,) = (tmp_path / "work").glob(".stale-*")
    assert (aside / "second" / "old-artifact").read_text() == "from the old upstream"
    assert (aside / "third.txt").exists() and (aside / "second" / "final").is_dir()
    assert [o.moved_aside for o in outcomes] == [None, str(aside / "second"), str(aside / "third.txt")]


INDEPENDENT = """
name: evals
workdir: {workdir}
stages:
  - name: eval_base
    command: eval
    output: "{{workdir}}/eval_base.txt"
  - name: sft
    command: train
    output: "{{workdir}}/sft"
  - name: eval_sft
    command: eval
    args: [--in, "{{stage.sft.output}}/final"]
    output: "{{workdir}}/eval_sft.txt"
"""


def test_a_stage_that_does_not_name_a_rerun_stage_stays_done(tmp_path):
    # Upstream is what a stage's arguments name: evaluating the base model again does not make
    # the SFT run (which never reads that evaluation) or its evaluation stale.
    ch = load_chain(write_chain(tmp_path, INDEPENDENT))
    assert [s.needs for s in ch.stages] == [(), (), ("sft",)]
    run_chain(ch, Executor())
    (tmp_path / "work" / "eval_base.txt").unlink()
    ex = Executor()
    outcomes = run_chain(ch, ex)
    assert [c[0] for c in ex.calls] == ["eval"] and ex.calls[0][-1].endswith("eval_base.txt")
    assert [o.ran for o in outcomes] == [True, False, False] and not list((tmp_path / "work").glob(".stale-*"))
    # ... while a rerun SFT makes its evaluation stale, as before
    import shutil

    shutil.rmtree(tmp_path / "work" / "sft")
    ex = Executor()
    run_chain(ch, ex)
    assert [c[0] for c in ex.calls] == ["train", "eval"] and ex.calls[1][-1].endswith("eval_sft.txt")
    (aside,) = (tmp_path / "work").glob(".stale-*")
    assert (aside / "eval_sft.txt").exists()


def test_markers_written_when_upstream_meant_every_earlier_stage_still_count(tmp_path):
    # A marker from before recorded every earlier stage; the stages it names still decide.
    ch = load_chain(write_chain(tmp_path, INDEPENDENT))
    run_chain(ch, Executor())
    marker = tmp_path / "work" / ".stages" / "eval_sft.json"
    data = json.loads(marker.read_text())
    base = json.loads((tmp_path / "work" / ".stages" / "eval_base.json").read_text())["run_id"]
    data["upstream"] = {"eval_base": base, **data["upstream"]}
    marker.write_text(json.dumps(data))
    assert stage_state(ch, ch.stage("eval_sft")) == "done"
    data["upstream"]["sft"] = "another-run"
    marker.write_text(json.dumps(data))
    assert stage_state(ch, ch.stage("eval_sft")) == "stale"


def test_a_missing_output_and_a_stale_output_outside_the_workdir_stop_the_chain(tmp_path):
    ch = load_chain(write_chain(tmp_path))
    with pytest.raises(StageError, match="does not exist"):
        run_chain(ch, Executor(write=False))
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    text = CHAIN.replace('"{{workdir}}/first.txt"', f'"{outside}"')
    (tmp_path / "fresh").mkdir()
    ch = load_chain(write_chain(tmp_path / "fresh", text))
    with pytest.raises(StageError, match="outside the workdir"):
        run_chain(ch, Executor())
    assert outside.read_text() == "not ours"


@pytest.mark.slow
def test_a_real_chain_eval_k_samples_then_rft_filter(tmp_path):
    from benchmarks.datasets import load_examples

    examples = load_examples("demo")[:3]
    script = tmp_path / "script.jsonl"
    with open(script, "w") as f:
        for ex in examples:
            turns = [f"<search>{ex.question}</search>", f"<answer>\\boxed{{{ex.answers[0]}}}</answer>"]
            f.write(json.dumps({"match": ex.question, "turns": turns}) + "\n")
    chain = tmp_path / "chain.yaml"
    chain.write_text(
        f"""
name: real
workdir: {tmp_path / "work"}
stages:
  - name: sample
    command: eval
    args: [--method, research, --dataset, demo, --limit, "3", --backend, scripted, --script, "{script}",
           --retriever, memory, --n-samples, "2"]
    set: [agent.temperature=0.5, agent.max_total_tokens=100000]
    output: "{{workdir}}/samples"
  - name: rft
    command: data rft-filter
    args: ["{{stage.sample.output}}/research-demo-test-k2", --step-scorer, rule, --step-agg, mean,
           --step-threshold, "0.0"]
    output: "{{workdir}}/rft"
"""
    )
    result = runner.invoke(app, ["train", "--stages", str(chain)])  # the same runner as `harness stages run`
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "work" / "rft" / "rft_summary.json").read_text())
    assert summary["n_in"] == 6 and summary["questions_in"] == 3
    assert summary["dropped"].get("duplicate", 0) >= 3  # scripted samples repeat: one kept per question
    result = runner.invoke(app, ["stages", "status", str(chain)])
    assert result.exit_code == 0 and result.output.count("done") >= 2, result.output


def test_train_stages_takes_a_chain_alone(tmp_path):
    result = runner.invoke(app, ["train", "--stages", str(write_chain(tmp_path)), "-c", "configs/train/x.yaml"])
    assert result.exit_code != 0 and "give it alone" in result.output


def test_a_second_runner_of_the_same_workdir_is_refused_with_the_holders_pid(tmp_path):
    import subprocess
    import sys

    ch = load_chain(write_chain(tmp_path))
    hold = (
        "import sys, time\nfrom harness.runlock import run_lock\n"
        "with run_lock(sys.argv[1]):\n    print('locked', flush=True)\n    time.sleep(60)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", hold, str(ch.state_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "locked"
        ex = Executor()
        with pytest.raises(StageError, match=f"in use.*pid {other.pid}"):
            run_chain(ch, ex)
        assert ex.calls == []
    finally:
        other.kill()
        other.wait()
    run_chain(ch, ex)  # the lock went with its holder
    assert len(ex.calls) == 3


# Nine levels of nine aliases (programs.faults.kit.ALIAS_BOMB): 9**9 values once expanded.
_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
BAD_CHAINS = {
    "syntax": ("name: [x\n", "is not valid YAML"),
    "duplicate key": ("name: x\nname: y\nstages: []\n", "key 'name' is given twice (first on line 1)"),
    "alias bomb": (_BOMB, "expand to more than 100,000 values"),
    "top-level list": ("- a\n- b\n", "a chain is a mapping"),
    "a key read as a boolean": ("name: c\non: 1\nstages: []\n", "unknown config key true at the top level"),
    "a stage key read as null": (
        "name: c\nstages:\n  - {name: a, command: eval, output: x, ~: 1}\n",
        "unknown config key null in 'stages[0]'",
    ),
}


@pytest.mark.parametrize("command", [["stages", "run"], ["stages", "status"], ["train", "--stages"]])
@pytest.mark.parametrize("case", list(BAD_CHAINS))
def test_a_chain_file_that_is_not_a_chain_is_named_without_a_traceback(tmp_path, case, command):
    """Issue 44 defect 3: every YAML problem of a chain file was a traceback (a ConfigError the
    stage commands did not expect)."""
    text, says = BAD_CHAINS[case]
    chain = tmp_path / "chain.yaml"
    chain.write_text(text)
    result = runner.invoke(app, [*command, str(chain)])
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.exception, out)
    assert str(chain) in out and says in out and "Traceback" not in out, out
