"""Weight sync without the disk: the trainer broadcasts each tensor to the SGLang server's workers
over a process group (NCCL on GPUs, gloo on CPU), SGLang's ``/init_weights_update_group`` +
``/update_weights_from_distributed`` protocol.

The group is separate from DeepSpeed's default one: a ``tcp://master_address:port`` rendezvous
(the trainer hosts the store and is rank 0) and a gloo or NCCL group on it, built as SGLang builds
its side (:func:`join_group`). The server's TP workers are ranks 1..N.

Tests: the protocol against a stand-in server that joins the group with :func:`join_group`
(tests/training/rl/test_dist_sync.py), and against real SGLang on CPU with gloo in the engine tier
(tests/engines/test_served_model.py::test_distributed_sync_by_broadcast). NCCL (GPU) is not
exercised here: no GPU on this machine.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import PrefixStore, rendezvous
from torch.distributed.distributed_c10d import Backend, _new_process_group_helper, _world

from harness.ports import free_port


def join_group(address: str, port: int, rank: int, world_size: int, group_name: str, comm: str, timeout_s: float):
    """A process group of ``world_size`` at ``address:port`` (rank 0 hosts the store), built the
    way SGLang's ``init_custom_process_group`` builds its side, so the two meet: a ``tcp://``
    rendezvous, the store prefixed with ``group_name``, then torch's group constructor (which
    prefixes ``group_name/`` again). Needs no default process group."""
    if comm not in ("gloo", "nccl"):
        raise ValueError(f"unknown weight-sync communication backend {comm!r}; use nccl or gloo")
    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{address}:{port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    # A private torch API, but the one every RLHF stack (and SGLang's receiving side) builds these
    # groups with: a group outside the default one, on its own store.
    pg, _ = _new_process_group_helper(
        world_size, rank, [], Backend(comm), store, group_name=group_name, backend_options=None, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


_GROUP_IDS = itertools.count()


class DistributedWeightSync:
    """Push full weights into one SGLang server by broadcast (see the module docstring)."""

    def __init__(
        self,
        backend: Any,
        server_ranks: int = 1,
        comm: str | None = None,
        master_address: str = "127.0.0.1",
        group_name: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.backend, self.server_ranks = backend, server_ranks
        self.comm = comm or ("nccl" if torch.cuda.is_available() else "gloo")
        # torch refuses a second group under one name in a process: a fresh name per sync object
        # (SGLang takes any name; its default is "weight_update_group").
        self.group_name = group_name or f"harness_weight_sync_{os.getpid()}_{next(_GROUP_IDS)}"
        self.address, self.timeout_s = master_address, timeout_s
        self.group: Any = None

    def _in_thread(self, fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["out"] = fn(*args)
            except Exception as e:  # re-raised in the caller's thread
                box["err"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, box

    @staticmethod
    def _finish(t: threading.Thread, box: dict[str, Any], timeout_s: float) -> Any:
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError("the SGLang server did not answer the weight-sync request in time")
        if "err" in box:
            raise box["err"]
        return box["out"]

    def connect(self) -> None:
        """The server joins (HTTP, in a thread) while the trainer joins as rank 0."""
        port, world = free_port(), 1 + self.server_ranks
        t, box = self._in_thread(
            self.backend.init_weights_update_group, self.address, port, 1, world, self.group_name, self.comm
        )
        self.group = join_group(self.address, port, 0, world, self.group_name, self.comm, self.timeout_s)
        self._finish(t, box, self.timeout_s)

    def push(self, state: dict[str, torch.Tensor], version: int, in_flight: str = "drain") -> None:
        """Announce names/dtypes/shapes over HTTP and broadcast the tensors in that order, inside
        the server's weight-update session (``/begin_weight_update`` ... ``/end_weight_update``,
        which SGLang 0.5.23 requires; servers without it skip that step). ``in_flight="pause"``:
        the requests in flight are retracted around it and go on under the new weights
        (:meth:`harness.backends.sglang.SGLangBackend.generation_paused`); ``drain``: SGLang's
        model-update lock makes the update wait for them."""
        pause = in_flight == "pause" and hasattr(self.backend, "generation_paused")
        with self.backend.generation_paused(pause) if pause else contextlib.nullcontext():
            self._push(state, version)

    def _push(self, state: dict[str, torch.Tensor], version: int) -> None:
        if self.group is None:
            self.connect()
        self.backend.begin_weight_update()
        names = list(state)
        dtypes = [str(state[k].dtype).removeprefix("torch.") for k in names]
        shapes = [list(state[k].shape) for k in names]
        t, box = self._in_thread(
            self.backend.update_weights_from_distributed, names, dtypes, shapes, self.group_name, version
        )
        device = torch.device("cuda", torch.cuda.current_device()) if self.comm == "nccl" else torch.device("cpu")
        for k in names:
            tensor = state[k].detach().to(device).contiguous()
            self.group.broadcast([tensor]).wait()
        self._finish(t, box, self.timeout_s)
        self.backend.end_weight_update()
        self.backend.weight_version = str(version)
