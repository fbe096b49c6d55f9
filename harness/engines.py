"""Launching real serving engines (SGLang, vLLM) as child processes.

Both engines pin their own torch, so they live in their own Python environments: pass that
environment's interpreter with ``python=``. The engine runs in a new process group; stopping
(Ctrl-C, SIGTERM, leaving the ``with`` block, or an exception in the run) terminates the whole
group, then kills it after a grace period. Its output goes to a log file, never to our terminal.

    with launch_engine("sglang", model_dir, python="/path/to/sglang-venv/bin/python") as engine:
        backend = SGLangBackend(engine.url, model=model_dir)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import httpx

from harness import safe_delete
from harness.config import require_at_least, require_between, require_positive
from harness.models import resolve_model
from harness.ports import free_port

logger = logging.getLogger(__name__)

Engine = Literal["sglang", "vllm"]
# The log files :func:`launch_engine` writes into its log folder (``ENGINE-PORT.log``), as a
# :data:`harness.safe_delete.Layout`: what a run folder's cleanup may remove as engine logs.
ENGINE_LOGS: safe_delete.Layout = {f"{e}-[0-9]*.log": safe_delete.FILE for e in get_args(Engine)}


class EngineError(RuntimeError):
    """The engine could not be started or did not become healthy."""


@dataclass(frozen=True)
class EngineConfig:
    """How to launch an engine (``harness serve model``, ``harness eval --launch``, training).

    ``python``: the interpreter of the engine's environment; by default ``$HARNESS_SGLANG_PYTHON``
    / ``$HARNESS_VLLM_PYTHON``, else the venv ``scripts/build_engine_venvs.sh`` builds under
    ``$HARNESS_ENGINE_DIR`` (``~/.cache/harness/engines/<engine>``), else this interpreter.
    ``device``: ``auto`` is ``cuda`` when ``nvidia-smi`` is on PATH, else ``cpu`` (which adds the
    CPU recipe's flags, REFERENCE §6). ``args``: extra engine flags, passed through verbatim.
    ``env``: extra environment variables for the engine (vLLM's RL endpoints need
    ``VLLM_SERVER_DEV_MODE=1``, runtime LoRA loading ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``).
    """

    python: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    host: str = "127.0.0.1"
    port: int | None = None
    tp: int = 1
    dp: int = 1
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    health_timeout: float = 900.0
    log_dir: str | None = None  # default: the run folder's engines/ (or ./engines)

    def __post_init__(self) -> None:
        require_between(self, 1, 65535, "port")
        require_at_least(self, 1, "tp", "dp")
        require_positive(self, "health_timeout")


def engine_dir() -> Path:
    """Where the engine venvs live (``$HARNESS_ENGINE_DIR``, default ``~/.cache/harness/engines``)."""
    return Path(os.environ.get("HARNESS_ENGINE_DIR") or Path.home() / ".cache" / "harness" / "engines")


def engine_python(engine: Engine, python: str | None = None) -> str:
    """The interpreter that runs ``engine`` (see :class:`EngineConfig`)."""
    if python:
        return python
    env = os.environ.get(f"HARNESS_{engine.upper()}_PYTHON")
    if env:
        return env
    venv = engine_dir() / engine / "bin" / "python"
    return str(venv) if engine_ready(engine) and venv.exists() else sys.executable


def engine_ready(engine: Engine) -> bool:
    """Whether a built venv for ``engine`` exists (what ``make test-engines`` builds)."""
    return (engine_dir() / engine / ".harness-built").is_file()


def detect_device() -> str:
    """``cuda`` when an NVIDIA driver is visible, else ``cpu``."""
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def engine_for_backend(kind: str) -> Engine:
    """The engine a backend kind launches: ``sglang`` → SGLang, ``openai`` → vLLM."""
    engines: dict[str, Engine] = {"sglang": "sglang", "openai": "vllm"}
    if kind not in engines:
        raise EngineError(f"--launch starts an engine for the sglang or openai backend, not {kind!r}")
    return engines[kind]


def engine_command(
    engine: Engine,
    model: str,
    python: str,
    host: str,
    port: int,
    tp: int = 1,
    dp: int = 1,
    device: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The command line that starts ``engine`` serving ``model`` (see REFERENCE §6 for CPU recipes).

    ``device="cpu"`` adds what the CPU builds need unless ``extra`` sets it already: SGLang's
    ``--device cpu``; vLLM's ``--dtype bfloat16 --max-model-len 2048 --gpu-memory-utilization 0.5``.
    """
    extra = list(extra or [])

    def unless_given(flag: str, *value: str) -> list[str]:
        return [] if any(a == flag or a.startswith(flag + "=") for a in extra) else [flag, *value]

    if engine == "sglang":
        cmd = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", str(port)]
        if tp > 1:
            cmd += ["--tp-size", str(tp)]
        if dp > 1:
            cmd += ["--dp-size", str(dp)]
        if device:
            cmd += unless_given("--device", device)
        return cmd + extra
    if engine == "vllm":
        # The `vllm` console script fails on CPU builds; the module entry point works.
        cmd = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            host,
            "--port",
            str(port),
        ]
        if tp > 1:
            cmd += ["--tensor-parallel-size", str(tp)]
        if dp > 1:
            cmd += ["--data-parallel-size", str(dp)]
        if device == "cpu":
            cmd += unless_given("--dtype", "bfloat16") + unless_given("--max-model-len", "2048")
            # On CPU this is the share of RAM vLLM reserves; its 0.92 default fails to start
            # whenever anything else holds memory.
            cmd += unless_given("--gpu-memory-utilization", "0.5")
        return cmd + extra
    raise EngineError(f"unknown engine {engine!r}; use sglang or vllm")


@dataclass
class EngineProcess:
    """A running engine: its URL, process and log file. Stop it with :meth:`stop` (idempotent)."""

    engine: Engine
    url: str
    proc: subprocess.Popen
    log_path: Path
    command: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the engine and let it shut its workers down; then SIGTERM, and after a few
        seconds SIGKILL, whatever is left of its process group. Idempotent."""
        pgid = self.proc.pid  # start_new_session: the engine leads its own group
        if self.proc.poll() is None:
            logger.info("stopping %s (pid %d)", self.engine, self.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within %.0f s; killing its process group", self.engine, grace_s)
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)  # workers the engine left behind (or all of it, after the grace)
            except ProcessLookupError:
                break  # the group is empty: everything stopped
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


def wait_healthy(
    url: str, proc: subprocess.Popen | None = None, timeout_s: float = 600.0, log: Path | None = None
) -> None:
    """Poll ``GET {url}/health`` until 200; fail fast if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-20:] if log and log.exists() else []
            raise EngineError(f"engine exited with code {proc.returncode} before it was healthy:\n" + "\n".join(tail))
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise EngineError(f"engine at {url} not healthy after {timeout_s:.0f} s" + (f"; see {log}" if log else ""))


def _die_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> None:
    """In the child (a ``preexec_fn``): ask Linux to send ``signum`` if the harness dies without
    stopping it; with ``parent`` (the harness's pid, read before the fork), exit at once when the
    harness already died before the request was made (the request would then never fire)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signum))  # 1 = PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def launch_engine(
    engine: Engine,
    model: str,
    python: str = "python",
    host: str = "127.0.0.1",
    port: int | None = None,
    tp: int = 1,
    dp: int = 1,
    device: str | None = None,
    extra: list[str] | None = None,
    log_dir: str | Path = ".",
    health_timeout_s: float = 600.0,
    env: dict[str, str] | None = None,
) -> EngineProcess:
    """Start an engine and wait until it is healthy. Binds to loopback unless told otherwise."""
    port = port or free_port(host)
    url = f"http://{host}:{port}"
    cmd = engine_command(engine, model, python, host, port, tp=tp, dp=dp, device=device, extra=extra)
    log_path = Path(log_dir) / f"{engine}-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("starting %s: %s (log %s)", engine, " ".join(cmd), log_path)
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: we stop the engine and all its workers
                preexec_fn=_die_with_parent,
                env={**os.environ, **(env or {})},
            )
        except FileNotFoundError as e:
            raise EngineError(f"cannot run {cmd[0]!r}: {e}; pass --python PATH of an env with {engine}") from None
    running = EngineProcess(engine=engine, url=url, proc=proc, log_path=log_path, command=cmd)
    try:
        wait_healthy(url, proc, timeout_s=health_timeout_s, log=log_path)
    except BaseException:
        running.stop()
        raise
    return running


@contextlib.contextmanager
def launched(engine: Engine, model: str, cfg: EngineConfig | None = None, log_dir: str | Path | None = None):
    """Start ``engine`` for ``model`` (a name, directory or hub id) with ``cfg``; yield the
    running :class:`EngineProcess`; stop it on leaving, whether the body succeeded or raised."""
    cfg = cfg or EngineConfig()
    device = detect_device() if cfg.device == "auto" else cfg.device
    proc = launch_engine(
        engine,
        resolve_model(model),  # the embedded model becomes a safetensors directory both engines load
        python=engine_python(engine, cfg.python),
        host=cfg.host,
        port=cfg.port,
        tp=cfg.tp,
        dp=cfg.dp,
        device=device,
        extra=list(cfg.args),
        log_dir=cfg.log_dir or log_dir or "engines",
        health_timeout_s=cfg.health_timeout,
        env={k: str(v) for k, v in cfg.env.items()},
    )
    logger.info("%s healthy at %s (log %s)", engine, proc.url, proc.log_path)
    try:
        yield proc
    finally:
        proc.stop()


def start_engine(
    stack: contextlib.ExitStack,
    engine: Engine,
    model: str,
    cfg: EngineConfig,
    log_dir: str | Path,
    say: Callable[[str], None] = logger.info,
) -> EngineProcess:
    """Launch ``engine`` for a run inside ``stack`` (leaving the stack stops the engine, however the
    run ends) and tell the user through ``say``; returns the running :class:`EngineProcess`."""
    say(f"launching {engine} for {model} ...")
    proc = stack.enter_context(launched(engine, model, cfg, log_dir=log_dir))
    say(f"{engine} up at {proc.url} (log {proc.log_path})")
    return proc


def serve_engine(engine: Engine, model: str, cfg: EngineConfig, ready: Callable[[EngineProcess], None]) -> None:
    """``harness serve model``: run ``engine`` for ``model`` until Ctrl-C or SIGTERM (which stop it
    and all its workers); ``ready`` is called once it is healthy. Raises :class:`EngineError` with
    the end of its log when the engine exits by itself."""
    with sigterm_as_exit(), launched(engine, model, cfg) as proc:
        ready(proc)
        while proc.alive():
            time.sleep(1.0)
        raise EngineError(
            f"{engine} exited with code {proc.proc.returncode}; last lines of {proc.log_path}:\n{proc.log_tail()}"
        )


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` so ``finally`` clauses (which stop
    launched engines) run; Ctrl-C already raises ``KeyboardInterrupt``."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
