"""Fixtures for harness tests: a tiny corpus, built indexes (module-scoped: numba compiles once)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from harness.ports import free_port

TINY = [
    ("t1", "Dog training", "Running dogs need a lot of exercise every day."),
    ("t2", "Cats", "A cat sleeps for most of the day."),
    ("t3", "Marathon", "People who run marathons train for months."),
    ("t4", "Paris", "Paris is the capital of France."),
    ("t5", "Ünïcode", "São Paulo is the largest city in Brazil."),
]


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    p = tmp_path_factory.mktemp("corpus") / "tiny.jsonl"
    p.write_text(
        "".join(json.dumps({"id": i, "contents": f"{t}\n{x}"}, ensure_ascii=False) + "\n" for i, t, x in TINY),
        encoding="utf-8",
    )
    return p


@pytest.fixture(scope="session")
def bm25_index(tiny_corpus, tmp_path_factory):
    from harness.retrieval.index import build_index

    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_index(tiny_corpus, "bm25", out)
    return out


@pytest.fixture(scope="session")
def bm25_retriever(bm25_index):
    from harness.retrieval.index import load_index

    r = load_index(bm25_index)
    r.search(["warm up"], 1)  # numba compiles on first use (~12 s): keep that out of timed requests
    return r


class ServerThread:
    """A uvicorn server for an ASGI app in a background thread, on a free loopback port."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def replay():
    """A :class:`~tests.helpers.replay_server.Replay` server on loopback, its ``url`` set."""
    from tests.helpers.replay_server import Replay

    r = Replay()
    with ServerThread(r.app()) as server:
        r.url = server.url
        yield r


@pytest.fixture(scope="module")
def pair():
    """One tiny model behind two hf backends: prefix reuse on, and off (the reference); the prefix
    cache's and the in-place KV layer's tests compare against it."""
    from harness.backends.hf import HFBackend
    from harness.tokenization import byte_tokenizer
    from tests.harness.test_backend_hf import _tiny_llama

    tok = byte_tokenizer()
    model = _tiny_llama(tok, seed=0, max_positions=512)
    on = HFBackend(model_obj=model, tokenizer=tok, max_batch_size=8)
    off = HFBackend(model_obj=model, tokenizer=tok, max_batch_size=8, prefix_cache_tokens=0)
    yield on, off, model, tok
    on.close()
    off.close()
