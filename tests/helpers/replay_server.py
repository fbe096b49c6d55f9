"""A small HTTP server that replays recorded engine responses, for backend tests over real HTTP.

Each test queues behaviours: a JSON body to return, an HTTP status, or a delay (so: 5xx N
times, a timeout, an ``abort`` body). With nothing queued it answers ``default`` (or a 500). The
server records every request body and headers, and the peak number of requests in flight.
Serve ``Replay().app()`` with ``tests.harness.conftest.ServerThread`` on a loopback port.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


class Replay:
    """Queued responses for ``/generate``, ``/v1/completions`` and weight-sync routes
    (``/update_weights_from_disk``, ``/load_lora_adapter``, ``/begin_weight_update``)."""

    def __init__(self) -> None:
        self.queue: deque[dict[str, Any]] = deque()
        self.default: dict[str, Any] | None = None
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.peak = 0
        self.healthy = True
        self.model_info: dict[str, Any] = {"model_path": None}
        self.models: list[dict[str, Any]] = [{"id": "served-model"}]  # what /v1/models lists

    def push(self, body: Any = None, status: int = 200, delay: float = 0.0) -> None:
        """Queue one answer: ``body`` as JSON with ``status``, after ``delay`` seconds."""
        self.queue.append({"body": body, "status": status, "delay": delay})

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health():
            return JSONResponse({}, status_code=200 if self.healthy else 503)

        @app.get("/v1/models")
        async def models():
            status = 200 if self.healthy else 503
            return JSONResponse({"data": self.models}, status_code=status)

        @app.get("/model_info")
        async def model_info():
            return self.model_info

        async def replay(request: Request):
            self.requests.append(await request.json())
            self.headers.append(dict(request.headers))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                b = self.queue.popleft() if self.queue else self.default
                if b is None:
                    return JSONResponse({"error": "nothing queued"}, status_code=500)
                if b["delay"]:
                    await asyncio.sleep(b["delay"])
                return JSONResponse(b["body"] if b["body"] is not None else {"error": "x"}, status_code=b["status"])
            finally:
                self.in_flight -= 1

        for path in (
            "/generate",
            "/v1/completions",
            "/update_weights_from_disk",
            "/load_lora_adapter",
            "/begin_weight_update",
        ):
            app.post(path)(replay)
        return app
