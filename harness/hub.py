"""Hugging Face hub access shared by datasets and prebuilt indexes: fail fast offline, resumable downloads.

Offline (``HF_HUB_OFFLINE=1``) or with the hub unreachable, callers fail at once with one message
instead of hanging in retries: :func:`hub_problem` says why in a few words (one quick probe).

:func:`download` fetches one hub file over plain HTTP(S) (``$HF_ENDPOINT/<repo>/resolve/<rev>/<file>``)
into ``dest``: the bytes go to ``dest.part`` and a rerun continues it with a ``Range`` request;
when the hub publishes the file's sha256 (the ``X-Linked-Etag`` of LFS/xet files) the finished file
is checked against it and a mismatch deletes the partial file. Used for files of tens of GB (the
wiki-18 E5 index), where ``hf_hub_download``'s cache layout would hold a second copy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

CHUNK = 8 << 20


class HubError(RuntimeError):
    """A hub file could not be fetched (offline, unreachable, missing, or not the published bytes)."""


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for no network."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = 5.0) -> str | None:
    """None when the hub answers; else why not. One quick probe, so offline never hangs in retries."""
    url = endpoint()
    try:
        httpx.head(url, timeout=timeout, follow_redirects=False)
        return None
    except httpx.HTTPError as e:
        return f"{url} unreachable ({type(e).__name__})"


def hub_problem() -> str | None:
    """Why the hub cannot be used now (offline flag or failed probe), or None."""
    return "offline (HF_HUB_OFFLINE is set)" if offline() else hub_reachable()


@dataclass(frozen=True)
class HubFile:
    """One file of a hub repository."""

    repo: str
    filename: str
    repo_type: str = "dataset"
    revision: str = "main"

    @property
    def url(self) -> str:
        prefix = {"dataset": "datasets/", "space": "spaces/"}.get(self.repo_type, "")
        return f"{endpoint()}/{prefix}{self.repo}/resolve/{self.revision}/{self.filename}"

    def __str__(self) -> str:
        return f"{self.repo}/{self.filename}"


def _headers() -> dict[str, str]:
    token = os.environ.get("HF_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def file_info(f: HubFile, timeout: float = 30.0) -> tuple[int | None, str | None]:
    """``(size, sha256)`` of a hub file from a HEAD on its resolve URL; either may be unknown (None).

    The hub answers a HEAD for an LFS/xet file with a redirect carrying ``X-Linked-Size`` and
    ``X-Linked-Etag`` (the sha256 of the content); a small git file has only a git-sha1 ETag,
    which is not a sha256 of anything we can check, so it gives None.
    """
    try:
        r = httpx.head(f.url, headers=_headers(), timeout=timeout, follow_redirects=False)
    except httpx.HTTPError as e:
        raise HubError(f"{f}: {endpoint()} unreachable ({type(e).__name__})") from e
    if r.status_code in (401, 403, 404):
        raise HubError(f"{f}: not found on the hub (HTTP {r.status_code} for {f.url})")
    if r.status_code >= 400:
        raise HubError(f"{f}: HTTP {r.status_code} for {f.url}")
    size = r.headers.get("x-linked-size") or (r.headers.get("content-length") if r.status_code == 200 else None)
    etag = (r.headers.get("x-linked-etag") or "").strip('"').removeprefix("W/").strip('"')
    sha = etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None
    return (int(size) if size and size.isdigit() else None), sha


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def download(f: HubFile, dest: str | Path, timeout: float = 60.0) -> Path:
    """Fetch ``f`` into ``dest``, resuming ``dest.part``; checks the published sha256 when there is one.

    A complete ``dest`` of the published size is kept as it is (a rerun costs one HEAD). Raises
    :class:`HubError` with one clear message offline, on HTTP errors, or on a checksum mismatch.
    """
    dest = Path(dest)
    problem = hub_problem()
    if problem is not None:
        raise HubError(f"cannot download {f}: {problem}")
    size, sha = file_info(f)
    if dest.is_file() and size is not None and dest.stat().st_size == size:
        logger.info("%s already downloaded (%d bytes)", dest, size)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if size is not None and have > size:  # not a prefix of this file: start over
        part.unlink()
        have = 0
    t0 = time.perf_counter()
    if size is None or have < size:
        headers = {**_headers(), **({"Range": f"bytes={have}-"} if have else {})}
        try:
            with httpx.stream("GET", f.url, headers=headers, timeout=timeout, follow_redirects=True) as r:
                if r.status_code == 416 and size is None:  # asked past the end: the part is complete
                    pass
                elif r.status_code >= 400:
                    raise HubError(f"{f}: HTTP {r.status_code} for {f.url}")
                else:
                    mode = "ab" if have and r.status_code == 206 else "wb"  # 200: the server ignored Range
                    if mode == "ab":
                        logger.info("resuming %s at byte %d", dest.name, have)
                    with open(part, mode) as out:
                        for block in r.iter_bytes(CHUNK):
                            out.write(block)
        except httpx.HTTPError as e:
            raise HubError(f"{f}: download interrupted ({type(e).__name__}: {e}); run again to resume") from e
    got = part.stat().st_size
    if size is not None and got != size:
        raise HubError(f"{f}: got {got} of {size} bytes; run again to resume")
    if sha is not None:
        digest = sha256_file(part)
        if digest != sha:
            part.unlink()
            raise HubError(f"{f}: sha256 {digest[:12]}… does not match the published {sha[:12]}…; deleted, run again")
        logger.info("%s: sha256 matches the hub's", dest.name)
    else:
        logger.warning("%s: the hub publishes no sha256 for this file; size checked only", f)
    os.replace(part, dest)
    logger.info("downloaded %s (%d bytes) in %.0f s", dest, got, time.perf_counter() - t0)
    return dest
