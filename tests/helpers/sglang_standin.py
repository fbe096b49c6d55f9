"""A stand-in for SGLang's weight-sync endpoints, for tests over real HTTP on loopback.

It answers what SGLang's server answers for ``/update_weights_from_disk``, ``/flush_cache``,
``/load_lora_adapter`` and ``/unload_lora_adapter`` (``{"success": true, ...}``) and records every
call in order as ``(path, body)``; ``/generate`` answers one fixed token. It checks nothing about
weights: tests that need real loading use the real engine tier (tests/engines)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


class SGLangStandIn:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.loaded: set[str] = set()
        self.version = "0"  # the weight_version it reports, as SGLang does in meta_info
        self.n_generated = 0
        self.group: Any = None  # distributed sync: the process group it joined (one worker)
        self.received: dict[str, Any] = {}  # name -> tensor received by broadcast
        self.in_session = False  # between /begin_weight_update and /end_weight_update

    def of(self, path: str) -> list[Any]:
        return [b for p, b in self.calls if p == path]

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health():
            return {}

        async def body(request: Request) -> Any:
            raw = await request.body()
            return await request.json() if raw else None

        @app.post("/update_weights_from_disk")
        async def update(request: Request):
            b = await body(request)
            self.calls.append(("/update_weights_from_disk", b))
            self.version = b.get("weight_version", self.version)
            return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

        @app.post("/pause_generation")
        async def pause(request: Request):
            self.calls.append(("/pause_generation", await body(request)))
            return {"message": "Generation paused successfully.", "status": "ok"}

        @app.post("/continue_generation")
        async def cont(request: Request):
            self.calls.append(("/continue_generation", await body(request)))
            return {"message": "Generation continued successfully.", "status": "ok"}

        @app.post("/flush_cache")
        async def flush(request: Request):
            self.calls.append(("/flush_cache", None))
            return JSONResponse({"text": "Cache flushed."})

        @app.post("/load_lora_adapter")
        async def load(request: Request):
            b = await body(request)
            self.calls.append(("/load_lora_adapter", b))
            self.loaded.add(b["lora_name"])
            return {"success": True, "loaded_adapters": {n: "x" for n in self.loaded}}

        @app.post("/unload_lora_adapter")
        async def unload(request: Request):
            b = await body(request)
            self.calls.append(("/unload_lora_adapter", b))
            if b["lora_name"] not in self.loaded:
                return JSONResponse({"success": False, "error_message": "not loaded"}, status_code=400)
            self.loaded.discard(b["lora_name"])
            return {"success": True, "loaded_adapters": {n: "x" for n in self.loaded}}

        @app.post("/init_weights_update_group")
        def init_group(payload: dict):  # a plain def: FastAPI runs it in a worker thread (it blocks)
            from unittest import mock

            from training.rl.dist_sync import join_group

            self.calls.append(("/init_weights_update_group", payload))
            p = payload
            # SGLang's workers and the trainer are separate processes; here both ends live in one,
            # and torch refuses a second group registered under the same name: skip registering it.
            with mock.patch("torch.distributed.distributed_c10d._register_process_group"):
                self.group = join_group(
                    p["master_address"],
                    p["master_port"],
                    p["rank_offset"],
                    p["world_size"],
                    p["group_name"],
                    p["backend"],
                    60,
                )
            return {"success": True, "message": "Succeeded to initialize custom process group."}

        @app.post("/begin_weight_update")
        async def begin(request: Request):
            self.calls.append(("/begin_weight_update", await body(request)))
            self.in_session = True
            return {"success": True, "message": "ok"}

        @app.post("/end_weight_update")
        async def end(request: Request):
            self.calls.append(("/end_weight_update", await body(request)))
            self.in_session = False
            return {"success": True, "message": "ok"}

        @app.post("/update_weights_from_distributed")
        def update_distributed(payload: dict):
            import torch

            self.calls.append(("/update_weights_from_distributed", payload))
            if not self.in_session:  # as SGLang 0.5.23 answers
                msg = "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
                return JSONResponse({"success": False, "message": msg}, status_code=400)
            for name, dtype, shape in zip(payload["names"], payload["dtypes"], payload["shapes"], strict=True):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                self.group.broadcast([t]).wait()
                self.received[name] = t
            self.version = payload.get("weight_version", self.version)
            return {"success": True, "message": "Succeeded to update parameter online."}

        @app.post("/generate")
        async def generate(request: Request):
            # 1 to 3 copies of one token, so samples differ in length; n samples as a list, as SGLang
            # does; a batch (a list of input_ids, one sampling_params each) answers one item per entry.
            b = await body(request)
            self.calls.append(("/generate", b))
            batched = bool(b["input_ids"]) and isinstance(b["input_ids"][0], list)
            prompts = b["input_ids"] if batched else [b["input_ids"]]
            params = (
                b["sampling_params"]
                if isinstance(b["sampling_params"], list)
                else [b["sampling_params"]] * len(prompts)
            )
            out = []
            for ids_in, sp in zip(prompts, params, strict=True):
                n = sp.get("n")
                items = []
                for _ in range(n or 1):
                    self.n_generated += 1
                    ids = [100] * (1 + self.n_generated % 3)
                    meta = {"finish_reason": {"type": "length"}, "prompt_tokens": len(ids_in)}
                    items.append({"text": "", "output_ids": ids, "meta_info": {**meta, "weight_version": self.version}})
                out.append(items if n else items[0])
            return out if batched else out[0]

        return app
