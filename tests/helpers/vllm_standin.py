"""A stand-in for vLLM 0.32's RL endpoints, answering as the real server answered when recorded
(``VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``, CPU build, SmolLM2, 2026-11-24):

- ``POST /pause?mode=wait|keep`` → ``{"status": "paused"}``; ``POST /resume`` → ``{"status": "resumed"}``
- ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}`` → ``{"results": [null]}``
  (a path without a model: 500 ``{"error": {"message": "Call to collective_rpc method failed: ..."}}``)
- ``POST /reset_prefix_cache[?reset_running_requests=true]`` → ``{"success": true}`` (``false``
  while KV blocks are held; ``reset_running_requests`` preempts the running requests first)
- ``POST /update_weight_version {"new_version"}`` → ``{"success": true, "new_version"}``; ``GET /weight_info``
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` → 200 text ``Success: LoRA adapter 'x'
  added successfully.`` (missing path: 404 ``{"error": {"message": "Loading lora x failed: No adapter found ..."}}``)
- ``POST /v1/unload_lora_adapter {"lora_name"}`` → 200 text ``... removed successfully.``
- a route the server lacks (dev mode off): 404 ``{"detail": "Not Found"}`` (FastAPI's own answer).

It records every call in order and what it "serves" (the weights directory, the adapters, the
version); ``/v1/completions`` answers with the model name it was asked for, so a test sees which
model (base or adapter) a rollout went to. ``dev_mode=False`` / ``lora=False`` drop those routes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse


class VLLMStandin:
    def __init__(self, dev_mode: bool = True, lora: bool = True, busy_resets: int = 0) -> None:
        self.dev_mode, self.lora = dev_mode, lora
        self.calls: list[tuple[str, Any]] = []
        self.weights_path: str | None = None
        self.version = "default"
        self.adapters: dict[str, str] = {}
        self.paused = False
        self.busy_resets = busy_resets  # answer success=false this many times first

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"data": [{"id": "base-model", "max_model_len": 2048}]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.calls.append(("/v1/completions", body))
            model = body["model"]
            if model != "base-model" and model not in self.adapters:
                return JSONResponse({"error": {"message": f"The model `{model}` does not exist."}}, status_code=404)
            ids = [65]
            return {"choices": [{"index": 0, "text": "A", "finish_reason": "length", "token_ids": ids}], "model": model}

        if self.dev_mode:
            self._dev_routes(app)
        if self.lora:
            self._lora_routes(app)
        return app

    def _dev_routes(self, app: FastAPI) -> None:
        @app.post("/pause")
        async def pause(mode: str = "abort"):
            self.calls.append(("/pause", {"mode": mode}))
            self.paused = True
            return {"status": "paused"}

        @app.post("/resume")
        async def resume():
            self.calls.append(("/resume", None))
            self.paused = False
            return {"status": "resumed"}

        @app.post("/collective_rpc")
        async def rpc(request: Request):
            body = await request.json()
            self.calls.append(("/collective_rpc", body))
            path = body.get("kwargs", {}).get("weights_path", "")
            if body.get("method") != "reload_weights" or not (Path(path) / "config.json").is_file():
                msg = f"Call to collective_rpc method failed: Worker failed with error 'Repo id must be ...: {path}'"
                return JSONResponse({"error": {"message": msg, "code": 500}}, status_code=500)
            self.weights_path = path
            return {"results": [None]}

        @app.post("/reset_prefix_cache")
        async def reset(reset_running_requests: bool = False):
            self.calls.append(
                ("/reset_prefix_cache", {"reset_running_requests": True} if reset_running_requests else None)
            )
            if self.busy_resets > 0:
                self.busy_resets -= 1
                return {"success": False}
            return {"success": True}

        @app.post("/update_weight_version")
        async def version(request: Request):
            body = await request.json()
            self.calls.append(("/update_weight_version", body))
            self.version = body["new_version"]
            return {"success": True, "new_version": self.version}

        @app.get("/weight_info")
        async def info():
            return {"weight_version": self.version}

    def _lora_routes(self, app: FastAPI) -> None:
        @app.post("/v1/load_lora_adapter")
        async def load(request: Request):
            body = await request.json()
            self.calls.append(("/v1/load_lora_adapter", body))
            name, path = body["lora_name"], body["lora_path"]
            if not (Path(path) / "adapter_config.json").is_file():
                msg = f"Loading lora {name} failed: No adapter found for {path}"
                return JSONResponse({"error": {"message": msg, "type": "NotFoundError", "code": 404}}, status_code=404)
            self.adapters[name] = path
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request):
            body = await request.json()
            self.calls.append(("/v1/unload_lora_adapter", body))
            self.adapters.pop(body["lora_name"], None)
            return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")
