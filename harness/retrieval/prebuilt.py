"""The papers' retrieval setting: published wiki-18 corpora and E5 indexes, downloaded and imported.

``harness index download NAME --dir DIR`` fetches the files of one entry of :data:`PREBUILT` from
the Hugging Face hub (resumable, sha256-checked where the hub publishes it, see
:mod:`harness.hub`), assembles them (split index parts concatenated, ``.gz``/``.zip`` unpacked),
and, for entries with an index, imports them with :func:`~harness.retrieval.index.import_index`
into ``DIR/index`` so ``harness serve retriever --index DIR/index`` and ``harness eval --index``
work at once. Sources (read from the projects' own docs and scripts):

- Search-R1 (``scripts/download.py``, ``docs/retriever.md`` in PeterGriffinJin/Search-R1): the
  flat E5 index as ``part_aa`` + ``part_ab`` in ``PeterJinGo/wiki-18-e5-index`` (concatenated to
  ``e5_Flat.index``) and the corpus ``wiki-18.jsonl.gz`` in ``PeterJinGo/wiki-18-corpus``;
  encoder ``intfloat/e5-base-v2`` (mean pooling, ``"query: "``).
- FlashRAG (README "Index" section in RUC-NLPIR/FlashRAG): the corpus ``wiki18_100w.zip`` in
  ``RUC-NLPIR/FlashRAG_datasets`` (``retrieval-corpus/``). FlashRAG publishes its E5 index
  (``wiki18_100w_e5_index.zip``) on ModelScope only, not on the HF hub: it is not downloaded
  here; fetch it yourself and run ``harness index import``.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.hub import CHUNK, HubError, HubFile, download, hub_problem
from harness.registry import Registry
from harness.retrieval.factory import cache_dir
from harness.retrieval.index import import_index

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prebuilt:
    """One published setting: its index parts (concatenated in order) and corpus, and the encoder."""

    name: str
    description: str
    corpus: HubFile
    corpus_file: str  # the JSONL name once unpacked
    index_parts: tuple[HubFile, ...] = ()
    index_file: str | None = None  # the assembled FAISS file
    model: str | None = None
    source: str = ""


PREBUILT: Registry[Prebuilt] = Registry("prebuilt index")


def _register(p: Prebuilt) -> None:
    PREBUILT.register(p.name, p)


_SEARCH_R1_CORPUS = HubFile("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz")
_register(
    Prebuilt(
        "wiki18-e5",
        "Search-R1's wiki-18 (21M 100-word passages) with its flat E5 index (e5-base-v2); ~75 GB",
        corpus=_SEARCH_R1_CORPUS,
        corpus_file="wiki-18.jsonl",
        index_parts=(
            HubFile("PeterJinGo/wiki-18-e5-index", "part_aa"),
            HubFile("PeterJinGo/wiki-18-e5-index", "part_ab"),
        ),
        index_file="e5_Flat.index",
        model="intfloat/e5-base-v2",
        source="PeterGriffinJin/Search-R1 scripts/download.py, docs/retriever.md",
    )
)
_register(
    Prebuilt(
        "wiki18-corpus",
        "Search-R1's wiki-18 corpus only (wiki-18.jsonl)",
        corpus=_SEARCH_R1_CORPUS,
        corpus_file="wiki-18.jsonl",
        source="PeterGriffinJin/Search-R1 scripts/download.py",
    )
)
_register(
    Prebuilt(
        "flashrag-wiki18-corpus",
        "FlashRAG's wiki18_100w corpus only (its E5 index is on ModelScope, not the HF hub: import it yourself)",
        corpus=HubFile("RUC-NLPIR/FlashRAG_datasets", "retrieval-corpus/wiki18_100w.zip"),
        corpus_file="wiki18_100w.jsonl",
        source="RUC-NLPIR/FlashRAG README (Index), hub RUC-NLPIR/FlashRAG_datasets",
    )
)


def _concat(parts: list[Path], dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".part")
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, out, CHUNK)
    tmp.replace(dest)


def _unpack(archive: Path, dest: Path) -> None:
    """``archive`` (.gz, .zip holding one .jsonl, or plain) streamed into ``dest``; never unpickles anything."""
    tmp = dest.with_name(dest.name + ".part")
    if archive.suffix == ".gz":
        with gzip.open(archive, "rb") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)
    elif archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            members = [m for m in z.namelist() if m.endswith(".jsonl") and not m.startswith("__MACOSX")]
            if len(members) != 1:
                raise HubError(f"{archive}: expected one .jsonl inside, found {members or 'none'}")
            with z.open(members[0]) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
    else:
        shutil.copyfile(archive, tmp)
    tmp.replace(dest)


def _fetch_corpus(p: Prebuilt, out: Path) -> Path:
    dest = out / p.corpus_file
    if dest.is_file():
        logger.info("%s already there", dest)
        return dest
    archive = download(p.corpus, out / Path(p.corpus.filename).name)
    if archive != dest:
        logger.info("unpacking %s into %s", archive.name, dest.name)
        _unpack(archive, dest)
        archive.unlink()  # the JSONL is what is read; the archive would only double the disk use
    return dest


def _fetch_index(p: Prebuilt, out: Path) -> Path | None:
    if not p.index_parts or p.index_file is None:
        return None
    dest = out / p.index_file
    if dest.is_file():
        logger.info("%s already there", dest)
        return dest
    parts = [download(f, out / Path(f.filename).name) for f in p.index_parts]
    if len(parts) == 1:
        parts[0].replace(dest)
    else:
        logger.info("concatenating %s into %s", " + ".join(x.name for x in parts), dest.name)
        _concat(parts, dest)
        for x in parts:
            x.unlink()  # parts plus the whole would need twice the space (60+ GB)
    return dest


def download_prebuilt(name: str, out_dir: str | Path | None = None, do_import: bool = True) -> dict[str, Any]:
    """Fetch (or finish fetching) the files of ``name`` into ``out_dir`` (default:
    ``$HARNESS_CACHE/prebuilt/NAME``); import the index when there is one.

    Returns ``{"corpus": path, "faiss": path or None, "index": index dir or None}``. Fails fast
    with one :class:`~harness.hub.HubError` offline.
    """
    p = PREBUILT.get(name)
    if out_dir is None:
        out_dir = cache_dir() / "prebuilt" / name
    out = Path(out_dir)
    problem = hub_problem()
    if problem is not None:
        have = (out / p.corpus_file).is_file() and (p.index_file is None or (out / p.index_file).is_file())
        if not have:
            raise HubError(
                f"cannot download {name} ({p.corpus}{', ' + str(p.index_parts[0].repo) if p.index_parts else ''}): "
                f"{problem}; download the files on a machine with hub access, then `harness index import`"
            )
    out.mkdir(parents=True, exist_ok=True)
    corpus = _fetch_corpus(p, out)
    faiss_file = _fetch_index(p, out)
    index_dir = None
    if faiss_file is not None and do_import:
        index_dir = out / "index"
        import_index(faiss_file, corpus, index_dir, model=p.model or "", source=f"{name}: {p.source}")
    return {"corpus": corpus, "faiss": faiss_file, "index": index_dir}
