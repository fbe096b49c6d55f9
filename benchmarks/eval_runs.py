"""``harness eval``'s orchestration: from its flags to configs, and a multi-run loop over them.

:func:`eval_configs` composes one :class:`~harness.eval_config.EvalConfig` per (dataset, method)
from ``-c`` files, then flags (:data:`FLAG_KEYS`), then ``key.path=value`` overrides, then the
metric profile; :func:`run_configs` runs them in turn through :func:`benchmarks.build.simple_evaluate`
with one shared backend, and with one engine for the whole loop when ``backend.launch`` asks for
it (:func:`launched_backend_config`). ``harness replicate`` and ``harness demo`` run their configs
through the same loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from benchmarks.build import build_eval, check_eval, run_dir_for, simple_evaluate
from benchmarks.evaluate import InfrastructureDown
from benchmarks.fmt import NAMES
from benchmarks.profiles import apply_profile
from harness.backends import build_backend
from harness.config import deep_merge, from_dict, load_yaml, parse_overrides, section, set_path
from harness.engines import engine_for_backend, sigterm_as_exit, start_engine
from harness.eval_config import EvalConfig
from harness.fsutil import write_error
from harness.runlog import RunDir

logger = logging.getLogger(__name__)

Say = Callable[[str], None]

# ``harness eval`` flag → config key path (only the flags a user gave are set).
FLAG_KEYS = {
    "split": "dataset.split",
    "limit": "dataset.limit",
    "sample": "dataset.sample",
    "seed": "dataset.seed",
    "data_dir": "dataset.data_dir",
    "backend": "backend.kind",
    "model": "backend.model",
    "url": "backend.url",
    "script": "backend.script",
    "retriever": "retriever.kind",
    "index": "retriever.index",
    "encoder": "retriever.encoder",
    "topk": "retriever.topk",
    "out": "out",
    "launch": "backend.launch",
    "n_samples": "n_samples",
    "label": "label",
    "schedule": "schedule",
}


class RunError(RuntimeError):
    """A backend or one of the runs could not be built or run; the message names which."""


def flags_config(flags: dict[str, Any]) -> dict[str, Any]:
    """The config tree the given flags (``None``: not given) set, by :data:`FLAG_KEYS`. ``url`` is
    comma-separated; an ``http`` retriever's URL comes with ``index`` (``url`` is the model server's)."""
    out: dict[str, Any] = {}
    for flag, path in FLAG_KEYS.items():
        value = flags.get(flag)
        if value is None:
            continue
        if flag == "url":
            value = [u.strip() for u in value.split(",") if u.strip()]
        set_path(out, path, value)
    if flags.get("retriever") == "http" and flags.get("index"):
        out["retriever"]["url"] = out["retriever"].pop("index")
    return out


def judge_flags(url: str | None, model: str | None, key_env: str | None) -> dict[str, Any]:
    """The ``judge`` config section from the ``--judge-*`` flags (only those given)."""
    values = {"url": url, "model": model, "api_key_env": key_env}
    judge = {k: v for k, v in values.items() if v is not None}
    return {"judge": judge} if judge else {}


def eval_configs(
    config_files: list[str],
    flags: dict[str, Any],
    overrides: list[str],
    method: str | None = None,
    dataset: str | None = None,
    metric_profile: str | None = None,
    judge: dict[str, Any] | None = None,
) -> list[EvalConfig]:
    """One config per (dataset, method) of the comma-separated ``method`` and ``dataset``.

    Precedence: ``config_files``, then ``flags``, then ``judge`` (:func:`judge_flags`), then
    ``overrides``, then ``metric_profile``. A ``-c`` file's method and dataset count unless
    ``method`` / ``dataset`` name others (else ``research`` on ``demo``). ``data_dir`` defaults to
    ``$HARNESS_DATA_DIR``. Raises ``ConfigError`` / ``KeyError`` / ``ValueError`` naming the problem.
    """
    flags = dict(flags)
    if flags.get("data_dir") is None and os.environ.get("HARNESS_DATA_DIR"):
        flags["data_dir"] = os.environ["HARNESS_DATA_DIR"]
    data: dict[str, Any] = {}
    for f in config_files:
        data = deep_merge(data, load_yaml(f))
    data = deep_merge(data, flags_config(flags))
    data = deep_merge(data, judge or {})
    data = deep_merge(data, parse_overrides(overrides))
    data = apply_profile(data, metric_profile)
    method = method or str(data.get("method") or "research")
    dataset = dataset or str(section(data, "dataset", "name, split, ...").get("name") or "demo")
    methods = [m.strip() for m in method.split(",") if m.strip()]
    if data.get("label") and len(methods) > 1:
        raise ValueError(f"--label names one run: give one --method, not {len(methods)} ({', '.join(methods)})")
    datasets = [d.strip() for d in dataset.split(",") if d.strip()]
    return [
        from_dict(EvalConfig, deep_merge(data, {"method": m, "dataset": {"name": ds}}))
        for ds in datasets
        for m in methods
    ]


def launched_backend_config(stack: contextlib.ExitStack, bcfg: Any, out: str, say: Say = logger.info) -> Any:
    """``bcfg`` itself, or (``launch: true``) a copy pointing at an engine started inside ``stack``.

    The run's config (and its hash, for resuming) keeps ``launch: true``, not the ephemeral URL.
    """
    if not bcfg.launch:
        return bcfg
    proc = start_engine(stack, engine_for_backend(bcfg.kind), bcfg.model, bcfg.engine, Path(out) / "engines", say=say)
    return replace(bcfg, url=[proc.url])


def run_configs(configs: list[EvalConfig], say: Say = logger.info) -> list[Any]:
    """Run each config in turn with one shared backend (and one launched engine, if asked); the
    engine is stopped and the backend closed however the runs end. Returns their results; raises
    :class:`RunError` naming the backend or the run that could not be built or run."""
    results = []
    for cfg in configs:  # every pair's own checks before the first pair starts (or an engine is launched)
        try:
            check_eval(cfg)
        except (ValueError, KeyError) as e:
            raise RunError(f"{cfg.name} on {cfg.dataset.name}: {e}") from e
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_as_exit())
        bcfg = configs[0].backend
        try:
            bcfg = launched_backend_config(stack, bcfg, configs[0].out, say)
            backend = build_backend(bcfg)
        except (ValueError, OSError, RuntimeError) as e:  # EngineError, BackendError are RuntimeErrors
            raise RunError(f"backend {bcfg.kind}: {e}") from e
        stack.callback(backend.close)
        for cfg in configs:
            label = f"{cfg.name} on {cfg.dataset.name}"
            try:
                run = build_eval(cfg, backend=backend)
                say(f"{label} → {run.run_dir}")
                headline = cfg.metrics[0] if cfg.metrics else "em"
                total = len(run.examples) * cfg.n_samples
                with Progress(total, run.run_dir, label, headline, say=say) as progress:
                    results.append(simple_evaluate(cfg, run=run, on_item=progress.add))
            except InfrastructureDown:
                raise  # its own exit status (1): the servers, not the run's config, are at fault
            except (ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
                raise RunError(f"{label}: {e}") from e
            except OSError as e:  # writing the run folder: a file in the way, read-only, a full disk
                raise RunError(f"{label}: {write_error(e, run_dir_for(cfg))}") from e
    return results


class Progress:
    """A rich progress bar on stderr with the running headline metric (EM unless the profile's
    first metric says otherwise). When stderr is not a terminal (piped, logged, a stage of a
    chain), a plain line through ``say`` instead, every :attr:`PLAIN_EVERY` of the items or
    :attr:`PLAIN_EVERY_S` seconds (checked as items finish), and one at the end."""

    PLAIN_EVERY = 0.1  # of the items
    PLAIN_EVERY_S = 30.0

    def __init__(self, total: int, run_dir: Any, label: str, metric: str = "em", say: Say | None = None) -> None:

        done = RunDir(run_dir).scores() if (run_dir / "scores.jsonl").exists() else []
        self.total, self.label, self.metric, self.say = total, label, metric, say
        self.n = len(done)
        self.scored = sum(1 for s in done if not s.error)
        # The running mean follows results.json's rule (benchmarks.evaluate.item_values): failed
        # items and missing values are left out.
        values = [v for s in done if not s.error and (v := s.metric(metric)) is not None]
        self.em_sum, self.valued = float(sum(values)), len(values)
        self._progress: Any = None
        self._t0 = self._said_at = time.monotonic()
        self._said_n = self.n

    def __enter__(self) -> Progress:
        console = Console(stderr=True)
        if console.is_terminal:
            self._progress = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            )
            self._progress.start()
            self._task = self._progress.add_task(self._desc(), total=self.total, completed=min(self.n, self.total))
        return self

    def _desc(self) -> str:
        em = f"{self.em_sum / self.valued:.3f}" if self.valued else "–"  # nothing scored yet: no score
        return f"{self.label}  {NAMES.get(self.metric, self.metric)} {em}"

    def _plain(self) -> None:
        now = time.monotonic()
        failed = self.n - self.scored
        tail = f", {failed} failed" if failed else ""
        if self.say is not None:
            self.say(f"{self._desc()}  {self.n}/{self.total} items{tail}, {now - self._t0:.0f} s")
        self._said_at, self._said_n = now, self.n

    def add(self, score: Any) -> None:
        self.n += 1
        if not score.error:  # a failed item is not scored: it does not count in the running metric
            self.scored += 1
            if (value := score.metric(self.metric)) is not None:
                self.em_sum, self.valued = self.em_sum + value, self.valued + 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=self._desc())
        elif (
            self.n - self._said_n >= max(1.0, self.PLAIN_EVERY * self.total)
            or time.monotonic() - self._said_at >= self.PLAIN_EVERY_S
        ):
            self._plain()

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self.n != self._said_n:
            self._plain()
