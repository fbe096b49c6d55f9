"""The retrieval server over real HTTP on loopback, each API, bad requests, and the client."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from harness.retrieval.base import RetrievalError
from harness.retrieval.http_client import HTTPRetriever
from harness.retrieval.server import create_app
from harness.types import Doc
from tests.harness.conftest import ServerThread, free_port

PARIS = {"id": "t4", "contents": "Paris\nParis is the capital of France."}


class Recorder:
    """A retriever that returns k numbered documents and remembers the k it was asked for."""

    index_id = "recorder"

    def __init__(self) -> None:
        self.ks: list[int] = []

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        if queries == ["boom"]:
            raise RuntimeError("index exploded")
        self.ks.append(k)
        return [[Doc(f"{q}-{i}", "T", f"text {i}", float(k - i)) for i in range(k)] for q in queries]


@pytest.fixture(scope="module")
def recorder_server():
    rec = Recorder()
    with ServerThread(create_app(rec, default_k=3, max_k=20)) as s:
        s.recorder = rec
        yield s


@pytest.fixture(scope="module")
def server(bm25_retriever):
    with ServerThread(create_app(bm25_retriever, max_k=10)) as s:
        yield s


def test_search_r1_api(server):
    r = httpx.post(server.url + "/retrieve", json={"queries": ["capital of France"], "topk": 2, "return_scores": True})
    assert r.status_code == 200
    first = r.json()["result"][0][0]
    assert set(first) == {"document", "score"} and first["document"] == PARIS and first["score"] > 0
    plain = httpx.post(server.url + "/retrieve", json={"queries": ["capital of France", "cat"], "topk": 1}).json()
    assert plain == {"result": [[PARIS], [{"id": "t2", "contents": "Cats\nA cat sleeps for most of the day."}]]}


def test_flashrag_api(server):
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "healthy" and health["index_id"]
    one = httpx.post(server.url + "/search", json={"query": "capital of France", "top_n": 1}).json()
    assert one == [PARIS]
    docs, scores = httpx.post(
        server.url + "/search", json={"query": "capital of France", "top_n": 1, "return_score": True}
    ).json()
    assert docs[0]["id"] == "t4" and scores[0] > 0
    batch = httpx.post(server.url + "/batch_search", json={"query": ["Paris", "cat sleeps"], "top_n": 1}).json()
    assert [row[0]["id"] for row in batch] == ["t4", "t2"]
    docs, scores = httpx.post(
        server.url + "/batch_search", json={"query": ["Paris", "cat sleeps"], "top_n": 1, "return_score": True}
    ).json()
    assert [r[0]["id"] for r in docs] == ["t4", "t2"] and len(scores) == 2 and scores[0][0] > 0


def test_default_k_per_api(recorder_server):
    url, rec = recorder_server.url, recorder_server.recorder
    httpx.post(url + "/retrieve", json={"queries": ["q"]})
    httpx.post(url + "/queries", json={"queries": ["q"]})
    httpx.post(url + "/search", json={"query": "q"})  # FlashRAG's server defaults top_n to 10
    httpx.post(url + "/batch_search", json={"query": ["q"], "top_n": 20})
    assert rec.ks[-4:] == [3, 3, 10, 20]


def test_retriever_failure_is_a_500_with_the_reason_and_the_server_survives(recorder_server):
    r = httpx.post(recorder_server.url + "/retrieve", json={"queries": ["boom"]})
    assert r.status_code == 500 and "index exploded" in r.json()["detail"]
    assert httpx.post(recorder_server.url + "/retrieve", json={"queries": ["ok"]}).status_code == 200


def test_r1_searcher_api(server):
    out = httpx.post(server.url + "/queries", json={"queries": ["cat sleeps"], "k": 1}).json()
    assert out == {"queries": ["cat sleeps"], "answers": [["Cats\nA cat sleeps for most of the day."]]}


@pytest.mark.parametrize(
    "path, payload, status, needle",
    [
        ("/retrieve", {"queries": [], "topk": 3}, 422, "at least one query"),
        ("/retrieve", {"queries": ["  "], "topk": 3}, 422, "query 0 is empty"),
        ("/retrieve", {"queries": ["x"], "topk": 0}, 422, "topk must be between 1 and 10"),
        ("/retrieve", {"queries": ["x"], "topk": 11}, 422, "topk must be between 1 and 10"),
        ("/retrieve", {"queries": "x"}, 422, "queries"),
        ("/search", {"query": ""}, 422, "query"),
        ("/search", {"query": 3}, 422, "query"),
        ("/batch_search", {"query": ["x"] * 1001}, 422, "at most 1000 queries"),
        ("/queries", {"queries": ["x"], "k": "3"}, 422, "k"),
        ("/queries", {"queries": [1, 2]}, 422, "queries.0"),
        ("/search", {"query": "x", "top_n": 101}, 422, "top_n must be between 1 and 10"),
        ("/search", {"query": "x", "return_score": "yes"}, 422, "return_score"),
        ("/retrieve", {"topk": 3}, 422, "queries: Field required"),
        ("/search", {"query": "x" * 5000}, 422, "query"),
    ],
)
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, path, payload, status, needle):
    r = httpx.post(server.url + path, json=payload)
    assert r.status_code == status
    assert needle in r.json()["detail"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_oversized_body(server):
    r = httpx.post(
        server.url + "/retrieve",
        content=b'{"queries": ["' + b"x" * (1 << 20) + b'"]}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and "larger than 1048576 bytes" in r.json()["detail"]

    def chunks():  # chunked transfer: no content-length for the server to check up front
        yield b'{"queries": ["'
        for _ in range(20):
            yield b"x" * 65536
        yield b'"]}'

    r = httpx.post(server.url + "/retrieve", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = httpx.post(server.url + "/retrieve", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("api", ["search_r1", "flashrag", "r1_searcher"])
def test_client_speaks_every_api(server, api):
    client = HTTPRetriever(server.url, api=api)
    res = client.search(["capital of France", "cat sleeps"], 2)
    assert [r[0].title for r in res] == ["Paris", "Cats"]
    assert res[0][0].text == "Paris is the capital of France."
    if api != "r1_searcher":  # R1-Searcher's API returns only contents
        assert res[0][0].id == "t4" and res[0][0].score > 0


def test_client_retries_then_reports_clearly():
    port = free_port()  # nothing listens here
    client = HTTPRetriever(f"http://127.0.0.1:{port}", retries=2, backoff=0.01, timeout=1)
    with pytest.raises(RetrievalError, match=rf"127.0.0.1:{port}/retrieve failed after 3 attempts"):
        client.search(["x"], 1)


@pytest.fixture
def flaky_server():
    """Answers 503 twice, then a valid Search-R1 response (or garbage for the query 'garbage')."""
    app, calls = FastAPI(), []

    @app.post("/retrieve")
    def retrieve(body: dict):
        calls.append(body)
        if body["queries"] == ["garbage"]:
            return {"no_result_key": True}
        if len(calls) <= 2:
            return JSONResponse({"detail": "warming up"}, status_code=503)
        return {"result": [[{"document": PARIS, "score": 1.5}]]}

    with ServerThread(app) as s:
        s.calls = calls
        yield s


def test_client_retries_5xx_then_succeeds(flaky_server):
    client = HTTPRetriever(flaky_server.url, retries=3, backoff=0.01)
    (docs,) = client.search(["capital"], 1)
    assert docs == [Doc("t4", "Paris", "Paris is the capital of France.", 1.5)]
    assert len(flaky_server.calls) == 3 and flaky_server.calls[0] == {
        "queries": ["capital"],
        "topk": 1,
        "return_scores": True,
    }
    assert client.index_id == f"http:search_r1:{flaky_server.url}"
    with pytest.raises(RetrievalError, match="unexpected shape"):
        client.search(["garbage"], 1)


def test_client_gives_up_on_persistent_5xx(flaky_server):
    client = HTTPRetriever(flaky_server.url, retries=1, backoff=0.01)
    with pytest.raises(RetrievalError, match=r"/retrieve failed after 2 attempts: HTTP 503"):
        client.search(["capital"], 1)


def test_client_4xx_is_not_retried(server):
    client = HTTPRetriever(server.url, retries=5, backoff=10)
    with pytest.raises(RetrievalError, match="refused the request"):
        client.search(["x"], 50)


def test_cli_serve_retriever_refuses_bad_arguments(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    r = runner.invoke(app, ["serve", "retriever", "--index", str(tmp_path)])
    assert r.exit_code == 2 and "not an index directory" in " ".join(r.output.split())
    r = runner.invoke(app, ["serve", "retriever", "--index", str(tmp_path), "--default-k", "5", "--max-k", "4"])
    assert r.exit_code == 2 and "--default-k must be between 1 and --max-k (4)" in " ".join(r.output.split())


@pytest.mark.slow
def test_cli_serve_retriever_end_to_end(bm25_index):
    """`harness serve retriever` in its own process answers over HTTP (numba compiles there: slow)."""
    import subprocess
    import sys
    import time

    port = free_port()
    cmd = [sys.executable, "-m", "cli.main", "serve", "retriever", "--index", str(bm25_index)]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.3)
        client = HTTPRetriever(f"http://127.0.0.1:{port}", api="r1_searcher")
        assert client.search(["capital of France"], 1)[0][0].title == "Paris"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_credentials_in_a_server_url_are_never_echoed(caplog):
    """Issue 31 defect 11: ``http://alice:s3cret@host`` was printed in errors and logs."""
    import socket

    from harness.errors import redact_urls
    from harness.retrieval.base import RetrievalError
    from harness.retrieval.http_client import HTTPRetriever

    assert redact_urls("at http://alice:s3cret@h:1/x and https://tok@h2/") == "at http://***@h:1/x and https://***@h2/"
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = HTTPRetriever(f"http://alice:s3cret@127.0.0.1:{port}", retries=1, backoff=0.0)
    with pytest.raises(RetrievalError) as e:
        r.search(["q"], 1)
    assert "s3cret" not in str(e.value) and "http://***@127.0.0.1" in str(e.value)
    assert "s3cret" not in caplog.text and "s3cret" not in r.index_id
