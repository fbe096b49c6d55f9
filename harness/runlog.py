"""Run directories: the product of every evaluation.

A run directory holds:

- ``manifest.json``: a :class:`~harness.run_records.RunManifest` (the resolved config, its hash,
  package versions, git revision, data / corpus / index identity, start time); written when the
  run starts.
- ``trajectories.jsonl``: one :class:`~harness.types.Trajectory` per line, appended and flushed
  (and fsync'ed) item by item, so an interrupt loses nothing that finished.
- ``scores.jsonl``: one :class:`~harness.run_records.ItemScore` per line.
- ``results.json``: the :class:`~harness.run_records.RunResults` aggregate, rewritten at the end.
- ``.harness-owned.json`` (:mod:`harness.safe_delete`'s marker: harness made the folder) and
  ``.harness.lock`` (:mod:`harness.runlock`: one writer at a time).

Logs are append-only: an item that is run again (a failed attempt retried on resume, or an item
killed between its trajectory and its score) appends new lines, and readers keep the last record
of each (example id, sample index). Earlier attempts stay in the files for inspection.

Resuming: the same config hash reopens the directory and skips finished items; another config,
or other data, corpus or index, is refused with a message that names what differs. A torn last
line (killed mid-write) is dropped on open.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import safe_delete
from harness.engines import ENGINE_LOGS
from harness.fsutil import write_json_atomic
from harness.run_records import ItemScore, RecordError, RunManifest, RunResults
from harness.textfiles import read_jsonl
from harness.types import Trajectory

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TRAJECTORIES = "trajectories.jsonl"
SCORES = "scores.jsonl"
RESULTS = "results.json"
# Everything harness writes into a run directory (glob patterns, see harness.safe_delete.Folder):
# all that may ever be deleted there. ``engines/``: the logs of engines launched for the run.
RUN_ENTRIES: safe_delete.Layout = {
    MANIFEST: safe_delete.FILE,
    TRAJECTORIES: safe_delete.FILE,
    SCORES: safe_delete.FILE,
    RESULTS: safe_delete.FILE,
    "engines": safe_delete.Folder(ENGINE_LOGS),
}  # and the temporaries of these names (harness.safe_delete)

_VERSIONED_PACKAGES = ("harness", "flashrag-dev", "torch", "transformers", "bm25s", "faiss-cpu", "deepspeed")

# Error kinds that mean the infrastructure failed, not the model: such items are run again when
# the run is resumed (model-side outcomes, such as no answer or a context overflow, are results).
RETRIABLE_ERROR_KINDS = frozenset({"retrieval", "backend", "timeout"})


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (another config, corrupt file, ...)."""


def config_hash(config: dict[str, Any]) -> str:
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_hash(path: str | Path) -> str:
    """sha256 of a file; remembered per (path, size, mtime), so a corpus is hashed once per process."""
    st = os.stat(path)
    return _file_hash(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _file_hash(path: str, size: int, mtime_ns: int, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_revision() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        r = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=False
        )
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _numbered_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of a run file the harness appends to (none when it does not exist
    yet); a torn final line (interrupted write) is skipped with a warning, any other bad line
    raises :class:`RunDirError` naming ``path:line``."""
    if path.exists():
        yield from read_jsonl(path, RunDirError, tolerant=True)


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of :func:`_numbered_records`, without their line numbers."""
    for _, record in _numbered_records(path):
        yield record


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old → new`` for every dotted config key whose value differs."""
    a, b = _flatten(old), _flatten(new)
    return [
        f"{k}: {a.get(k, '<unset>')!r} → {b.get(k, '<unset>')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def _last_by_key(records: list[Any], key: Any) -> list[Any]:
    """The last record of each key, in the order the keys first appeared."""
    latest: dict[Any, Any] = {}
    for r in records:
        k = key(r)
        latest.pop(k, None)  # re-insert: order of the latest attempt
        latest[k] = r
    return list(latest.values())


class RunDir:
    """One (method, dataset) run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # ---- reading -------------------------------------------------------------------------
    @property
    def manifest(self) -> RunManifest:
        p = self.path / MANIFEST
        if not p.exists():
            raise RunDirError(f"{self.path} is not a run directory (no {MANIFEST})")
        try:
            return RunManifest.from_dict(json.loads(p.read_text(encoding="utf-8")), where=str(p))
        except (json.JSONDecodeError, RecordError) as e:
            raise RunDirError(f"{p}: {e}") from None

    def trajectories(self, attempts: bool = False) -> list[Trajectory]:
        """The trajectory of each item (its latest attempt; every attempt with ``attempts``)."""
        path, out = self.path / TRAJECTORIES, []
        for lineno, d in _numbered_records(path):
            try:
                out.append(Trajectory.from_dict(d))
            except (TypeError, KeyError, ValueError, AttributeError) as e:  # JSON, but not a trajectory
                raise RunDirError(f"{path}:{lineno}: not a trajectory record ({e})") from None
        return out if attempts else _last_by_key(out, lambda t: (t.example_id, t.sample_index))

    def scores(self, attempts: bool = False) -> list[ItemScore]:
        """The score of each item (its latest attempt; every attempt with ``attempts``)."""
        path = self.path / SCORES
        try:
            out = [ItemScore.from_dict(d, where=str(path)) for d in _records(path)]
        except RecordError as e:
            raise RunDirError(str(e)) from None
        return out if attempts else _last_by_key(out, lambda s: s.key)

    def results(self) -> RunResults | None:
        p = self.path / RESULTS
        if not p.exists():
            return None
        try:
            return RunResults.from_dict(json.loads(p.read_text(encoding="utf-8")), where=str(p))
        except (json.JSONDecodeError, RecordError) as e:
            raise RunDirError(f"{p}: {e}") from None

    def finished_keys(self) -> set[tuple[str, int]]:
        """(example id, sample index) of every item that is done: its trajectory and its score are
        on disk, and its latest attempt did not fail for an infrastructure reason (those are retried)."""
        done = {(t["example_id"], t.get("sample_index", 0)) for t in _records(self.path / TRAJECTORIES)}
        return {s.key for s in self.scores() if s.key in done and s.error_kind not in RETRIABLE_ERROR_KINDS}

    # ---- writing -------------------------------------------------------------------------
    def open(self, manifest: RunManifest) -> bool:
        """Create the directory and write ``manifest``, or reopen the run it already holds.

        Returns True when resuming. Raises :class:`RunDirError`, naming what differs, when the
        directory holds a run with another config, other items, or another corpus or index.
        """
        manifest.config_hash = config_hash(manifest.config)
        manifest_path = self.path / MANIFEST
        if manifest_path.exists():
            self._check_same_run(self.manifest, manifest)
            self._repair_torn_lines()
            return True
        safe_delete.claim(self.path, "eval")  # created by harness: the marker proves it to a later delete
        manifest.versions = manifest.versions or package_versions()
        manifest.git_revision = manifest.git_revision or git_revision()
        manifest.started_at = manifest.started_at or time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json_atomic(manifest_path, manifest.to_dict())
        return False

    def _check_same_run(self, old: RunManifest, new: RunManifest) -> None:
        where = f"{self.path} holds a run with"
        hint = "use another --out, or delete that directory to start over"
        if old.config_hash != new.config_hash:
            diffs = config_differences(old.config, new.config) or [
                f"config hash {old.config_hash} != {new.config_hash}"
            ]
            raise RunDirError(f"{where} another config ({'; '.join(diffs)}); {hint}")
        for name, label in (("data_hash", "items"), ("corpus_hash", "corpus"), ("index_id", "index")):
            before, now = getattr(old, name), getattr(new, name)
            if before is not None and now is not None and before != now:
                raise RunDirError(
                    f"{where} other {label}: {name} was {before}, is now {now} (the data changed since that "
                    f"run started); {hint}"
                )

    def _repair_torn_lines(self) -> None:
        """Rewrite files whose last line is torn so appends start on a clean line."""
        for name in (TRAJECTORIES, SCORES):
            p = self.path / name
            if not p.exists():
                continue
            raw = p.read_bytes()
            if raw and not raw.endswith(b"\n"):
                keep = raw[: raw.rfind(b"\n") + 1]
                logger.warning("%s: truncating a torn last line before resuming", p)
                p.write_bytes(keep)

    def append(self, trajectory: Trajectory, score: ItemScore) -> None:
        """Append one finished item (trajectory first, then its score), flushed to disk.

        An item killed between the two writes has a trajectory and no score: it is not finished,
        is run again on resume, and readers keep its latest trajectory.
        """
        for name, record in ((TRAJECTORIES, trajectory.to_dict()), (SCORES, score.to_dict())):
            with open(self.path / name, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def append_score(self, score: ItemScore) -> None:
        """Append a new score of an already finished item (it becomes the item's latest), flushed.

        Used when a metric is filled in later (an LLM-judge verdict that was missing)."""
        with open(self.path / SCORES, "a", encoding="utf-8") as f:
            f.write(json.dumps(score.to_dict(), ensure_ascii=False, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_results(self, results: RunResults) -> None:
        write_json_atomic(self.path / RESULTS, results.to_dict())
