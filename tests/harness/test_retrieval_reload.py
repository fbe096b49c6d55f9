"""``harness serve retriever``'s ``POST /admin/reload_encoder``: loopback only, atomic swap, fresh cache."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from harness.retrieval.encoders import Encoder
from harness.retrieval.index import load_index
from harness.retrieval.server import create_app
from tests.harness.conftest import ServerThread
from tests.helpers.harr_toy import tiny_tower, toy_index

QUERIES = ["Name the secret of the purple owl?", "copper mine code", "What hides beneath the frozen lantern?"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reload")
    first = tiny_tower(seed=0)
    index = toy_index(tmp, first)
    return index, first.save(tmp / "enc0"), tiny_tower(seed=7).save(tmp / "enc1")


def _ids(retriever, queries=QUERIES, k=5):
    return [[d.id for d in docs] for docs in retriever.search(queries, k)]


def test_reload_swaps_encoder_over_real_loopback_server(dirs):
    index, enc0, enc1 = dirs
    app = create_app(load_index(index, encoder=Encoder(str(enc0), device="cpu")), max_k=10)
    want_new = _ids(load_index(index, encoder=Encoder(str(enc1), device="cpu")))
    with ServerThread(app) as s:

        def ask():
            r = httpx.post(f"{s.url}/retrieve", json={"queries": QUERIES, "topk": 5}, timeout=30)
            return [[d["id"] for d in docs] for docs in r.json()["result"]]

        before = ask()
        assert before != want_new  # the two encoders rank differently, so the test can see the swap
        assert httpx.get(f"{s.url}/metrics").json()["embed_cache"]["entries"] == len(QUERIES)
        r = httpx.post(f"{s.url}/admin/reload_encoder", json={"path": str(enc1)}, timeout=60)
        assert r.status_code == 200 and r.json() == {"status": "ok", "encoder": str(enc1), "version": 1}
        metrics = httpx.get(f"{s.url}/metrics").json()
        assert metrics["encoder"] == {"version": 1, "path": str(enc1)}
        assert metrics["embed_cache"]["entries"] == 0  # old vectors are gone
        assert ask() == want_new
        bad = httpx.post(f"{s.url}/admin/reload_encoder", json={"path": str(index / "nope")}, timeout=60)
        assert bad.status_code == 422 and "reload failed" in bad.json()["detail"]
        assert httpx.get(f"{s.url}/admin/reload_encoder").status_code == 405
        assert ask() == want_new  # a failed reload leaves the served encoder alone


def test_reload_refuses_non_loopback_clients(dirs):
    index, enc0, enc1 = dirs
    app = create_app(load_index(index, encoder=Encoder(str(enc0), device="cpu")))

    async def post(client):
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post("/admin/reload_encoder", json={"path": str(enc1)})

    r = asyncio.run(post(("10.1.2.3", 4242)))
    assert r.status_code == 403 and "loopback" in r.json()["detail"]
    assert getattr(app, "encoder_version", 0) == 0


def test_swap_waits_for_the_batch_in_flight(dirs):
    """The swap takes the search lock: while a search holds it the old encoder stays in place."""
    index, enc0, enc1 = dirs
    app = create_app(load_index(index, encoder=Encoder(str(enc0), device="cpu")))
    target = app.retriever
    old = target.encoder
    target._lock.acquire()  # a batch "in flight"
    try:
        t = threading.Thread(target=app.reload_encoder, args=(str(enc1),))
        t.start()
        time.sleep(1.0)  # the new encoder loads (outside the lock) and then waits on it
        assert target.encoder is old
    finally:
        target._lock.release()
    t.join(timeout=60)
    assert target.encoder is not old and app.encoder_version == 1
