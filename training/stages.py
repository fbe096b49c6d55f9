"""Stage chains: ordered ``harness`` invocations, each feeding the next, resumable.

A chain file (``configs/train/prorag/chain.yaml``)::

    name: prorag
    workdir: runs/prorag            # --workdir overrides; markers live in WORKDIR/.stages/
    vars: {model: Qwen/Qwen3-8B}    # --set model=... overrides
    stages:
      - name: sft
        command: train                              # a harness command (and subcommand)
        config: [configs/train/prorag/sft.yaml]     # its config files (-c each)
        set: ["model.path={vars.model}"]            # its config overrides (key=value)
        output: "{workdir}/sft"                     # passed as --out
        rerun_args: [--overwrite]   # appended when a half-finished output is run again
      - name: sample
        command: eval
        args: [--model, "{stage.sft.output}/final", --n-samples, "4"]   # its other options
        output: "{workdir}/samples"

A stage is data: ``command`` (its first word one of :data:`STAGE_COMMANDS`, the ``harness``
commands that are finite runs leaving an output), ``config`` and ``set`` (what a reader such as
the memory planner loads through the config loader), ``args`` (the command's other options) and
``output``; the runner builds the argument list (:attr:`Stage.argv`:
``COMMAND -c CONFIG... ARGS... --out OUTPUT SET...``).
Placeholders, in any of them, are ``{workdir}``, ``{vars.NAME}``, ``{self.output}`` and
``{stage.NAME.output}`` of an EARLIER stage. Anything else in braces that looks like a placeholder
is an error; braces with other text (``[{kind: run, path: X}]``) are left alone.

State, per stage, from its marker ``WORKDIR/.stages/NAME.json`` (written atomically):

- ``done``: the marker says done, the output exists, and the upstream stages' markers are the
  ones it was run after: skipped (never re-run). A stage's upstream is the stages whose outputs
  its arguments name (``{stage.NAME.output}``), and theirs in turn: running an evaluation stage
  again leaves a training stage that does not read it done;
- ``partial``: the marker says running (an earlier attempt died or failed) with the same
  upstream: run again with ``rerun_args`` appended (the command resumes or overwrites);
- ``stale``: an output with no marker, or one made after other upstream results: moved aside
  (never deleted) into ``WORKDIR/.stale-<time>/`` when it lies inside the workdir, with a
  warning that names where, then run afresh; outside the workdir the chain stops and says so;
- ``todo``: no output yet.

The runner walks the stages in order, runs every stage that is not done, and stops at the first
failure with the stage name, exit status, command and log file (``WORKDIR/.stages/NAME.log``).
What runs a stage is the executor the program hands to :func:`run_chain`: ``harness stages run``
runs each stage as its own ``harness`` process in a process group of its own that dies with the
runner, so one stage's memory (a model, an engine) is gone before the next starts. Everything a
stage writes survives a kill (flushed appends, atomic renames), so the next run resumes it. One
runner per workdir: ``WORKDIR/.stages/.harness.lock``.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import ConfigError, not_a_string_key, read_yaml
from harness.fsutil import write_json_atomic
from harness.runlock import RunLockedError, run_lock
from harness.safe_delete import move_aside

logger = logging.getLogger(__name__)

STATE_DIR = ".stages"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w-]*(?:\.[\w-]+)*)\}")
_NAME = re.compile(r"^[A-Za-z0-9_][\w-]*$")
_STAGE_KEYS = {"name", "command", "config", "set", "args", "output", "rerun_args"}
_CHAIN_KEYS = {"name", "workdir", "vars", "stages", "papers", "description"}
# The harness commands a stage may run: finite runs that leave an output at --out (servers, the
# demo and chains themselves are not stages). The CLI's command table is checked against it.
STAGE_COMMANDS = ("data", "datasets", "eval", "index", "prompt", "replicate", "report", "score", "train")


class StageError(RuntimeError):
    """A chain cannot be read, or a stage failed; the message names the stage and what to do."""


@dataclass(frozen=True)
class Stage:
    """One resolved stage (placeholders filled): what it runs, as fields; :attr:`argv` builds the
    command line."""

    name: str
    command: tuple[str, ...]  # the harness command and subcommand: ("train",), ("data", "mcts")
    output: str  # resolved path, passed as --out
    config: tuple[str, ...] = ()  # config files, each passed as -c
    set: tuple[str, ...] = ()  # config overrides key=value, passed last
    args: tuple[str, ...] = ()  # the command's other arguments
    rerun_args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # earlier stages whose output its arguments name ({stage.NAME.output})

    @property
    def argv(self) -> tuple[str, ...]:
        """The arguments after ``harness`` that run this stage."""
        configs = [a for c in self.config for a in ("-c", c)]
        return (*self.command, *configs, *self.args, "--out", self.output, *self.set)


@dataclass(frozen=True)
class Chain:
    """A resolved chain: its stages in order, the workdir their outputs and markers go under
    (:attr:`state_dir`), its vars after ``--set``, and the file it was read from (``source``)."""

    name: str
    workdir: str
    stages: tuple[Stage, ...]
    vars: dict[str, str] = field(default_factory=dict)
    source: str = ""

    @property
    def state_dir(self) -> Path:
        return Path(self.workdir) / STATE_DIR

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise StageError(f"chain {self.name!r} has no stage {name!r} (stages: {', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]


# ---- reading ---------------------------------------------------------------------------------
def _substitute(text: str, values: dict[str, str], where: str) -> str:
    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            known = ", ".join("{" + k + "}" for k in values) or "none"
            raise StageError(f"{where}: unknown placeholder {{{key}}} (known here: {known})")
        return values[key]

    return _PLACEHOLDER.sub(one, text)


def load_chain(path: str | Path, workdir: str | None = None, variables: dict[str, str] | None = None) -> Chain:
    """Read and resolve a chain file; every problem raises :class:`StageError` naming where."""
    path = Path(path)
    if not path.is_file():
        raise StageError(f"{path}: no such chain file")
    try:
        data = read_yaml(path)
    except ConfigError as e:  # not YAML, a key given twice, an alias bomb, not UTF-8: named, no traceback
        raise StageError(str(e).replace("config file", "chain file", 1)) from None
    if not isinstance(data, dict):
        raise StageError(f"{path}: a chain is a mapping with name, workdir, vars, stages")
    _string_keys(data, str(path))
    unknown = set(data) - _CHAIN_KEYS
    if unknown:
        raise StageError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(_CHAIN_KEYS))})"
        )
    name = str(data.get("name") or path.stem)
    wd = str(workdir or data.get("workdir") or Path("runs") / name)
    raw_vars = {str(k): str(v) for k, v in (data.get("vars") or {}).items()}
    for k, v in (variables or {}).items():
        if k not in raw_vars:
            raise StageError(f"--set {k}: the chain has no var {k!r} (vars: {', '.join(raw_vars) or 'none'})")
        raw_vars[k] = str(v)
    values = {"workdir": wd}
    for k, v in raw_vars.items():
        values[f"vars.{k}"] = _substitute(v, values, f"{path}: vars.{k}")
    stages: list[Stage] = []
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise StageError(f"{path}: 'stages' must be a non-empty list")
    for i, raw in enumerate(raw_stages):
        stage = _read_stage(raw, f"{path}: stages[{i}]", values, {s.name for s in stages})
        values[f"stage.{stage.name}.output"] = stage.output
        stages.append(stage)
    return Chain(name, wd, tuple(stages), {k[5:]: v for k, v in values.items() if k.startswith("vars.")}, str(path))


def _string_keys(data: dict, path: str, section: str = "") -> None:
    """A key YAML read as no string (``on:``, ``1:``, ``~:``) in the chain file ``path`` (in its
    ``section``) is named, not a TypeError from sorting it."""
    odd = [k for k in data if not isinstance(k, str)]
    if odd:
        raise StageError(f"{path}: {not_a_string_key(odd[0], section)}")


def _read_stage(raw: Any, where: str, values: dict[str, str], earlier: set[str]) -> Stage:
    if not isinstance(raw, dict):
        raise StageError(f"{where}: a stage is a mapping with name, command, output (and config, set, args)")
    _string_keys(raw, *where.split(": ", 1))  # where: "CHAIN: stages[i]"
    unknown = set(raw) - _STAGE_KEYS
    missing = {"name", "command", "output"} - set(raw)
    if unknown or missing:
        raise StageError(
            f"{where}: {'unknown key(s) ' + ', '.join(sorted(unknown)) if unknown else ''}"
            f"{'; ' if unknown and missing else ''}{'missing ' + ', '.join(sorted(missing)) if missing else ''}"
        )
    name = str(raw["name"])
    where = f"{where} ({name})"
    if not _NAME.match(name) or name in earlier:
        raise StageError(f"{where}: stage names are unique words (letters, digits, _ and -)")
    lists = {k: raw.get(k) or [] for k in ("config", "set", "args", "rerun_args")}
    bad = [k for k, v in lists.items() if not isinstance(v, list)]
    if bad:
        raise StageError(f"{where}: {', '.join(bad)} must be list(s) of arguments")
    command = str(raw["command"]).split()
    if not command or command[0] not in STAGE_COMMANDS:
        raise StageError(
            f"{where}: command must be a harness stage command ({', '.join(STAGE_COMMANDS)}), not {raw['command']!r}"
        )
    sets = [str(x) for x in lists["set"]]
    not_kv = [x for x in sets if "=" not in x]
    if not_kv:
        raise StageError(f"{where}: set: each item is key=value, not {not_kv[0]!r}")
    output = _substitute(str(raw["output"]), values, f"{where}: output")
    if not output.strip():
        raise StageError(f"{where}: empty output")
    local = {**values, "self.output": output}
    texts = [*command, *(str(a) for v in lists.values() for a in v), str(raw["output"])]
    named = (m.group(1) for a in texts for m in _PLACEHOLDER.finditer(a))
    needs = tuple(dict.fromkeys(k.split(".")[1] for k in named if k.startswith("stage.")))

    def resolved(key: str) -> tuple[str, ...]:
        return tuple(_substitute(str(a), local, f"{where}: {key}") for a in lists[key])

    return Stage(
        name,
        tuple(command),
        output,
        resolved("config"),
        resolved("set"),
        resolved("args"),
        resolved("rerun_args"),
        needs,
    )


# ---- state -----------------------------------------------------------------------------------
def marker_path(chain: Chain, stage: Stage) -> Path:
    return chain.state_dir / f"{stage.name}.json"


def read_marker(chain: Chain, stage: Stage) -> dict[str, Any] | None:
    p = marker_path(chain, stage)
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise StageError(f"{p}: unreadable stage marker ({e}); delete it to run stage {stage.name!r} again") from None


def _upstream(chain: Chain, stage: Stage) -> dict[str, str | None]:
    """The run ids of the done markers of ``stage``'s upstream: the stages it names, and theirs."""
    wanted, todo = set(), list(stage.needs)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += chain.stage(name).needs
    out: dict[str, str | None] = {}
    for s in chain.stages:  # in chain order
        if s.name in wanted:
            m = read_marker(chain, s)
            out[s.name] = m.get("run_id") if m and m.get("state") == "done" else None
    return out


def _same_upstream(recorded: Any, current: dict[str, str | None]) -> bool:
    """Whether a marker was written after ``current`` (a marker may record more stages: those
    written before upstream meant named stages recorded every earlier one)."""
    return isinstance(recorded, dict) and all(k in recorded and recorded[k] == v for k, v in current.items())


def stage_state(chain: Chain, stage: Stage) -> str:
    """``done``, ``partial``, ``stale`` or ``todo`` (see the module docstring)."""
    m = read_marker(chain, stage)
    exists = Path(stage.output).exists()
    same_upstream = m is not None and _same_upstream(m.get("upstream"), _upstream(chain, stage))
    if m and m.get("state") == "done" and exists and same_upstream:
        return "done"
    if m and m.get("state") == "running" and same_upstream:
        return "partial"
    return "stale" if exists else "todo"


def _write_marker(chain: Chain, stage: Stage, state: str, run_id: str, argv: list[str], **extra: Any) -> None:
    chain.state_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "chain": chain.name,
        "chain_file": chain.source,
        "stage": stage.name,
        "state": state,
        "run_id": run_id,
        "argv": ["harness", *argv],
        "output": stage.output,
        "upstream": _upstream(chain, stage),
        **extra,
    }
    write_json_atomic(marker_path(chain, stage), record)


def _move_stale(chain: Chain, stage: Stage, stamp: str) -> Path:
    """Move a stale output aside into ``WORKDIR/.stale-<stamp>/`` (never deleted: a missing
    marker may be the only thing wrong with it); returns where it went."""
    out = Path(stage.output)
    workdir = Path(chain.workdir).resolve()
    if workdir not in out.resolve().parents:
        raise StageError(
            f"stage {stage.name!r}: its output {stage.output} exists but was not made by this chain after its "
            f"current upstream, and lies outside the workdir {chain.workdir}; move it away (or delete it) and rerun"
        )
    dest = move_aside(out, Path(chain.workdir) / f".stale-{stamp}" / out.resolve().relative_to(workdir))
    logger.warning(
        "stage %s: its output %s was not made by this chain after its current upstream (stale); moved it aside to "
        "%s (delete that when you no longer need it)",
        stage.name,
        out,
        dest,
    )
    return dest


# ---- running ---------------------------------------------------------------------------------
# Runs ``harness ARGV`` (the stage's :attr:`Stage.argv`) with its output into the log file; returns
# the exit status. The program running the chain hands one in (``harness stages run``'s runs each
# stage as a child process of its own); tests hand in fakes.
Executor = Callable[[list[str], Path], int]


@dataclass
class StageOutcome:
    """What the runner did with one stage: its state before, whether it ran (and for how long),
    and where a stale output was moved aside to."""

    name: str
    state_before: str
    ran: bool
    wall_s: float = 0.0
    moved_aside: str | None = None  # where a stale output went


def run_chain(chain: Chain, executor: Executor, dry_run: bool = False) -> list[StageOutcome]:
    """Run every stage that is not done, in order, each through ``executor``; raises
    :class:`StageError` at the first failure, or when another runner holds the workdir (its pid
    named)."""
    if dry_run:
        return _run_chain(chain, executor, dry_run)

    try:
        with run_lock(chain.state_dir, "stage chain"):
            return _run_chain(chain, executor, dry_run)
    except RunLockedError as e:
        raise StageError(str(e)) from None


def _run_chain(chain: Chain, executor: Executor, dry_run: bool) -> list[StageOutcome]:
    outcomes: list[StageOutcome] = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for stage in chain.stages:
        state = stage_state(chain, stage)
        if state == "done":
            _warn_if_changed(chain, stage)
            logger.info("stage %s: done (output %s), skipped", stage.name, stage.output)
            outcomes.append(StageOutcome(stage.name, state, ran=False))
            continue
        argv = list(stage.argv) + (list(stage.rerun_args) if state == "partial" else [])
        if dry_run:
            outcomes.append(StageOutcome(stage.name, state, ran=False))
            continue
        moved = str(_move_stale(chain, stage, stamp)) if state == "stale" else None
        run_id = uuid.uuid4().hex[:12]
        logger.info("stage %s (%s): harness %s", stage.name, state, " ".join(argv))
        _write_marker(chain, stage, "running", run_id, argv, started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        log = chain.state_dir / f"{stage.name}.log"
        t0 = time.perf_counter()
        rc = executor(argv, log)
        wall = time.perf_counter() - t0
        if rc != 0:
            raise StageError(
                f"stage {stage.name!r} failed (exit status {rc}) after {wall:.0f} s: harness {' '.join(argv)}; "
                f"log: {log}. Fix it and rerun the chain: finished stages are not run again"
            )
        if not Path(stage.output).exists():
            raise StageError(
                f"stage {stage.name!r} exited 0 but its declared output {stage.output} does not exist: "
                f"the stage's command and its 'output' disagree (log: {log})"
            )
        _write_marker(
            chain,
            stage,
            "done",
            run_id,
            argv,
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            wall_s=round(wall, 1),
        )
        outcomes.append(StageOutcome(stage.name, state, ran=True, wall_s=wall, moved_aside=moved))
    return outcomes


def _warn_if_changed(chain: Chain, stage: Stage) -> None:
    m = read_marker(chain, stage) or {}
    done_with = [a for a in m.get("argv", [])[1:]]
    if done_with[: len(stage.argv)] != list(stage.argv):
        logger.warning(
            "stage %s is done, but with other arguments than the chain now gives (%s); delete %s to run it again",
            stage.name,
            " ".join(done_with),
            stage.output,
        )
