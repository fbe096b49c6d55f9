"""`harness index download`, offline: a loopback server speaks the hub's resolve protocol (HEAD with
X-Linked-Size / X-Linked-Etag, GET with Range). No real network is touched."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from harness.hub import HubError, HubFile, download
from harness.retrieval.index import read_manifest
from harness.retrieval.prebuilt import download_prebuilt

N = 40


class FakeHub:
    """Serves ``files`` ({"datasets/<repo>/resolve/main/<name>": bytes}) like the hub's resolve URLs."""

    def __init__(self, files: dict[str, bytes], shas: dict[str, str] | None = None) -> None:
        self.files, self.log = files, []
        self.shas = shas or {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _body(self):
                key = self.path.lstrip("/")
                hub.log.append((self.command, key, self.headers.get("Range")))
                return key, hub.files.get(key)

            def do_HEAD(self):
                key, body = self._body()
                if self.path == "/":
                    self.send_response(200)
                    self.end_headers()
                    return
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(302)  # as the hub does for LFS/xet files
                self.send_header("Location", "/cdn/" + key)
                self.send_header("X-Linked-Size", str(len(body)))
                self.send_header("X-Linked-Etag", f'"{hub.shas[key]}"')
                self.end_headers()

            def do_GET(self):
                key, body = self._body()
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(rng.removeprefix("bytes=").rstrip("-"))
                    self.send_response(206)
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def wiki_like(tmp_path):
    """A tiny e5-shaped setting: a 768-d flat inner-product index of N vectors and an N-row corpus."""
    import faiss

    vecs = np.random.default_rng(1).standard_normal((N, 768)).astype(np.float32)  # [N, 768]
    index = faiss.index_factory(768, "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(vecs)
    faiss.write_index(index, str(tmp_path / "src.index"))
    rows = "".join(json.dumps({"id": str(i + 1), "contents": f'"Title {i}"\ntext {i}'}) + "\n" for i in range(N))
    return (tmp_path / "src.index").read_bytes(), rows.encode()


def key(f: HubFile) -> str:
    return f"datasets/{f.repo}/resolve/main/{f.filename}"


@pytest.fixture
def hub_env(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)

    def point(url: str) -> None:
        monkeypatch.setenv("HF_ENDPOINT", url)

    return point


def test_search_r1_setting_downloads_concatenates_unpacks_and_imports(tmp_path, hub_env):
    index_bytes, corpus = wiki_like(tmp_path)
    cut = len(index_bytes) // 3
    files = {
        "datasets/PeterJinGo/wiki-18-e5-index/resolve/main/part_aa": index_bytes[:cut],
        "datasets/PeterJinGo/wiki-18-e5-index/resolve/main/part_ab": index_bytes[cut:],
        "datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz": gzip.compress(corpus),
    }
    out = tmp_path / "wiki18"
    out.mkdir()
    # An interrupted earlier run left half of part_ab: only the rest is asked for.
    (out / "part_ab.part").write_bytes(index_bytes[cut : cut + 1000])
    with FakeHub(files) as hub:
        hub_env(hub.url)
        got = download_prebuilt("wiki18-e5", out)
        gets = [(k, r) for m, k, r in hub.log if m == "GET"]
        assert ("datasets/PeterJinGo/wiki-18-e5-index/resolve/main/part_ab", "bytes=1000-") in gets
        assert ("datasets/PeterJinGo/wiki-18-e5-index/resolve/main/part_aa", None) in gets
        assert (out / "e5_Flat.index").read_bytes() == index_bytes  # parts concatenated in order
        assert (out / "wiki-18.jsonl").read_bytes() == corpus  # gunzipped
        assert sorted(p.name for p in out.iterdir()) == ["e5_Flat.index", "index", "wiki-18.jsonl"]  # parts gone
        m = read_manifest(got["index"])
        assert m["imported"] and m["num_docs"] == N and m["dim"] == 768
        assert (m["model"], m["pooling"], m["query_prefix"]) == ("intfloat/e5-base-v2", "mean", "query: ")
        assert m["source"].startswith("wiki18-e5")
        # A rerun finds everything in place: no GET at all.
        n_gets = len(gets)
        download_prebuilt("wiki18-e5", out)
        assert len([1 for m_, *_ in hub.log if m_ == "GET"]) == n_gets


def test_published_sha256_mismatch_deletes_the_partial_file(tmp_path, hub_env):
    f = HubFile("org/repo", "data.bin")
    with FakeHub({key(f): b"x" * 5000}, shas={key(f): "0" * 64}) as hub:
        hub_env(hub.url)
        with pytest.raises(HubError, match=r"org/repo/data.bin: sha256 .* does not match the published 000000000000"):
            download(f, tmp_path / "data.bin")
    assert not (tmp_path / "data.bin").exists() and not (tmp_path / "data.bin.part").exists()


def test_missing_file_and_zip_corpus(tmp_path, hub_env):
    corpus = b'{"id": "1", "contents": "A\\nb"}\n'
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("wiki18_100w.jsonl", corpus)
    files = {"datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main/retrieval-corpus/wiki18_100w.zip": buf.getvalue()}
    with FakeHub(files) as hub:
        hub_env(hub.url)
        got = download_prebuilt("flashrag-wiki18-corpus", tmp_path / "fr")
        assert got["corpus"].read_bytes() == corpus and got["index"] is None
        with pytest.raises(HubError, match="org/none/x.bin: not found on the hub"):
            download(HubFile("org/none", "x.bin"), tmp_path / "x.bin")


def test_offline_fails_fast_with_one_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    with pytest.raises(HubError, match=r"cannot download wiki18-e5 .*offline \(HF_HUB_OFFLINE is set\).*index import"):
        download_prebuilt("wiki18-e5", tmp_path / "w")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(HubError, match=r"127.0.0.1:9 unreachable"):
        download_prebuilt("wiki18-corpus", tmp_path / "w")
    assert time.time() - t0 < 15


def test_cli_download(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["index", "download", "--list"])
    assert r.exit_code == 0 and "wiki18-e5" in r.output and "PeterJinGo/wiki-18-e5-index/part_aa" in r.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = CliRunner().invoke(app, ["index", "download", "wiki18-e5", "--dir", str(tmp_path)])
    assert r.exit_code != 0 and "HF_HUB_OFFLINE is set" in r.output
    r = CliRunner().invoke(app, ["index", "download", "wiki-19"])
    assert r.exit_code != 0 and "unknown published setting 'wiki-19'" in r.output
