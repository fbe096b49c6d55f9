"""Bad input to ``harness eval`` (and the YAML every command reads) is a message naming what and
where, exit 2, never a traceback, and leaves no run folder (issue 31 defects 5, 8 and 10)."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()

# Nine levels of nine aliases each: 9**9 (387 million) values once expanded, 300 bytes of YAML.
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


def eval_args(out: Path, *extra: str) -> list[str]:
    return [
        "eval", "--method", "search_r1", "--dataset", "demo", "--backend", "scripted", "--retriever", "memory",
        "--out", str(out), "--limit", "2", *extra,
    ]  # fmt: skip


def said(res) -> str:
    return " ".join(res.output.split())


def refused(res) -> str:
    """The one-line error of a refused command (exit 2, no traceback)."""
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output, res.output
    return said(res)


def test_an_alias_bomb_under_a_free_form_key_is_refused_at_once_naming_the_file(tmp_path):
    """``judge:`` (eval) and ``source.values`` (a recipe) take any YAML: the bomb was expanded by
    ``to_dict`` (1.6 GB in 31 s). Now it is measured, not expanded, as the file is read."""
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text("judge:\n" + indent(BOMB))
    t0 = time.perf_counter()
    out = refused(runner.invoke(app, [*eval_args(tmp_path / "runs"), "-c", str(cfg)]))
    assert time.perf_counter() - t0 < 5
    assert f"config file {cfg}: its aliases (*name) expand to more than 100,000 values" in out
    assert not (tmp_path / "runs").exists()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: x\nalgo: {kind: sft}\nsft:\n  sources:\n    - kind: chat\n      values:\n" + indent(indent(indent(BOMB)))
    )
    out = refused(runner.invoke(app, ["train", "-c", str(recipe), "--out", str(tmp_path / "run")]))
    assert f"config file {recipe}: its aliases" in out and not (tmp_path / "run").exists()


def test_the_yaml_bounds():
    from harness.config import ConfigError, parse_overrides, parse_yaml

    small = parse_yaml("base: &b {lr: 1, steps: 2}\nsft: *b\nrl: *b\n", "f")
    assert small["sft"] == small["rl"] == {"lr": 1, "steps": 2}  # ordinary aliases still load
    with pytest.raises(ConfigError, match=r"^f: its aliases"):
        parse_yaml(BOMB, "f")
    with pytest.raises(ConfigError, match="nests deeper than 100 levels"):
        parse_yaml("[" * 5000, "f")
    with pytest.raises(ConfigError, match="an alias refers to itself"):
        parse_yaml("a: &a [1, *a]", "f")
    with pytest.raises(ConfigError, match=r"^override 'a=\[': value is not valid YAML"):
        parse_overrides(["a=["])


def test_a_key_given_twice_is_refused_with_both_lines():
    from harness.config import ConfigError, parse_yaml

    with pytest.raises(ConfigError, match=r"^f is not valid YAML: key 'out' is given twice \(first on line 2\)") as e:
        parse_yaml("trainer:\n  out: a\n  lr: 1\n  out: b\n", "f")
    assert "line 4" in str(e.value)
    merged = parse_yaml("base: &b {lr: 1, steps: 2}\nrl:\n  <<: *b\n  lr: 3\n", "f")
    assert merged["rl"] == {"lr": 3, "steps": 2}  # a merge may still be overridden
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n", "f") == {"a": {"x": 1}, "b": {"x": 2}}  # one key per mapping


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("deep.yaml", b"judge: " + b"[" * 5000, "deep.yaml nests deeper than 100 levels"),
        ("judge.yaml", b"judge: 5\n", "judge must be a mapping (the LLM judge's options: url, model, ...), not int 5"),
        ("latin1.yaml", "label: caf\xe9\n".encode("latin-1"), "latin1.yaml is not UTF-8 text (byte 10: b'\\xe9')"),
    ],
)
def test_a_bad_config_file_is_a_message(tmp_path, name, content, message):
    cfg = tmp_path / name
    cfg.write_bytes(content)
    out = refused(runner.invoke(app, [*eval_args(tmp_path / "runs"), "-c", str(cfg)]))
    assert message in out, out
    assert not (tmp_path / "runs").exists()


def test_a_split_cannot_take_the_run_out_of_out(tmp_path):
    """Issue 31 defect 10: ``--split ../../x`` named a run directory outside ``--out``."""
    (tmp_path / "data" / "hotpotqa").mkdir(parents=True)
    (tmp_path / "x.jsonl").write_text(json.dumps({"id": "q", "question": "Q?", "golden_answers": ["a"]}) + "\n")
    args = eval_args(tmp_path / "a" / "runs", "--split", "../../x")
    args[args.index("demo")] = "hotpotqa"
    out = refused(runner.invoke(app, [*args, "--data-dir", str(tmp_path / "data")]))
    assert "dataset.split '../../x': use letters, digits" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "x.jsonl"]


def test_out_in_the_way_of_a_file_is_a_message(tmp_path):
    (tmp_path / "f").write_text("x")
    out = refused(runner.invoke(app, eval_args(tmp_path / "f")))
    assert (
        f"{tmp_path / 'f' / 'search_r1-demo-test'}: {tmp_path / 'f'} is a file, not a folder; pick another --out" in out
    )
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "search_r1-demo-test").write_text("x")
    out = refused(runner.invoke(app, eval_args(tmp_path / "runs")))
    assert f"{tmp_path / 'runs' / 'search_r1-demo-test'} is a file, not a folder" in out


def test_a_read_only_out_is_a_message(tmp_path, monkeypatch):
    """OSError 30 (read-only file system; tests run as root, so a chmod would not refuse)."""
    real = Path.mkdir

    def read_only(self, *a, **k):
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", read_only)
    out = refused(runner.invoke(app, eval_args(tmp_path / "ro")))
    assert "is on a read-only file system; pick another --out" in out


def test_a_full_disk_mid_run_is_a_message_and_what_finished_is_kept(tmp_path, monkeypatch):
    """OSError 28 from the run log's append (runlog.py): the data is intact, the message said so
    only as a traceback."""
    from harness.runlog import RunDir

    real, calls = RunDir.append, []

    def full(self, trajectory, score):
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path / "trajectories.jsonl"))
        return real(self, trajectory, score)

    monkeypatch.setattr(RunDir, "append", full)
    out = refused(runner.invoke(app, eval_args(tmp_path / "runs", "agent.max_concurrency=1")))
    run = tmp_path / "runs" / "search_r1-demo-test"
    assert f"the disk is full (writing {run / 'trajectories.jsonl'}); what finished is saved" in out
    assert len((run / "scores.jsonl").read_text().splitlines()) == 1
    monkeypatch.undo()
    res = runner.invoke(app, eval_args(tmp_path / "runs"))  # space again: the same command resumes
    assert res.exit_code == 0, res.output
    assert len((run / "scores.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("on: 1\n", "unknown config key true at the top level: YAML reads this key as a boolean"),
        ("agent:\n  yes: 1\n", "unknown config key true in 'agent'"),
        ("retriever:\n  ~: 1\n", "unknown config key null in 'retriever': YAML reads this key as null"),
        ("judge:\n  1: x\n", "unknown config key 1 in 'judge': YAML reads this key as a number"),
    ],
)
def test_a_key_yaml_reads_as_no_string_is_named(tmp_path, yaml_text, message):
    """Issue 44 defect 4: the did-you-mean hint compared a bool, int or None key with the option
    names: a TypeError traceback."""
    (tmp_path / "c.yaml").write_text(yaml_text)
    out = refused(runner.invoke(app, [*eval_args(tmp_path / "runs"), "-c", str(tmp_path / "c.yaml")]))
    assert message in out and 'Quote it ("on": ...)' in out, out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("judge.url=5", "judge.url must be an http(s):// endpoint (such as http://host:8000/v1), got '5'"),
        ("judge.timeout=abc", "judge.timeout: expected a number, got 'abc'"),
        ("judge.timeout=0", "judge.timeout must be greater than 0"),
        ("judge.retries=-1", "judge.retries must be at least 0"),
        ("retriever.timeout=.inf", "retriever.timeout: expected a finite number, got inf"),
        ("retriever.timeout=.nan", "retriever.timeout: expected a finite number, got nan"),
    ],
)
def test_judge_and_numeric_values_are_checked_before_the_run(tmp_path, option, message):
    """Issue 44 defects 5 and 6: ``judge.url: 5`` was an AttributeError traceback after the run
    folder was made, ``judge.timeout: abc`` was accepted (every judge call then failed, exit 0),
    ``retriever.timeout=.inf`` an OverflowError leaving a run folder and ``.nan`` a message that
    named no key."""
    out = refused(runner.invoke(app, [*eval_args(tmp_path / "runs"), "metrics=[em,judge]", option]))
    assert message in out, out
    assert not (tmp_path / "runs").exists()


def test_a_config_given_as_a_pipe_is_read(tmp_path):
    """Issue 44: ``-c <(...)`` (a pipe, /dev/fd/N) was "config file ... does not exist"."""
    import os

    read, write = os.pipe()
    os.write(write, b"agent:\n  max_turns: 1\n")
    os.close(write)
    try:
        res = runner.invoke(app, [*eval_args(tmp_path / "runs"), "-c", f"/dev/fd/{read}"])
    finally:
        os.close(read)
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "runs" / "search_r1-demo-test" / "manifest.json").read_text())
    assert manifest["config"]["agent"]["max_turns"] == 1
