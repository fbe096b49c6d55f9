"""Weight sync without the disk: the trainer broadcasts each tensor to the SGLang server's workers
over a process group (NCCL on GPUs, gloo on CPU), SGLang's ``/init_weights_update_group`` +
``/update_weights_from_distributed`` protocol.

The group is separate from DeepSpeed's default one: a ``TCPStore`` at ``master_address:port``
(the trainer is its master and rank 0), prefixed with the group name, and a gloo or NCCL process
group built on it directly. The server's TP workers are ranks 1..N.

NOT exercised against real SGLang: tests run the protocol against a stand-in server that joins
the group the same way (tests/training/test_dist_sync.py). Whether SGLang's
``init_custom_process_group`` rendezvous (its store prefixes) meets this one is unverified; the
disk path (``/update_weights_from_disk``) is the tested one.
"""

from __future__ import annotations

import socket
import threading
from datetime import timedelta
from typing import Any

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_group(address: str, port: int, rank: int, world_size: int, group_name: str, comm: str, timeout_s: float):
    """A process group of ``world_size`` at ``address:port`` (rank 0 hosts the store)."""
    from torch.distributed import PrefixStore, TCPStore

    store = PrefixStore(group_name, TCPStore(address, port, world_size, rank == 0, timedelta(seconds=timeout_s)))
    if comm == "gloo":
        return torch.distributed.ProcessGroupGloo(store, rank, world_size, timedelta(seconds=timeout_s))
    if comm == "nccl":
        return torch.distributed.ProcessGroupNCCL(store, rank, world_size)
    raise ValueError(f"unknown weight-sync communication backend {comm!r}; use nccl or gloo")


class DistributedWeightSync:
    """Push full weights into one SGLang server by broadcast (see the module docstring)."""

    def __init__(
        self,
        backend: Any,
        server_ranks: int = 1,
        comm: str | None = None,
        master_address: str = "127.0.0.1",
        group_name: str = "weight_update_group",
        timeout_s: float = 600.0,
    ) -> None:
        self.backend, self.server_ranks = backend, server_ranks
        self.comm = comm or ("nccl" if torch.cuda.is_available() else "gloo")
        self.address, self.group_name, self.timeout_s = master_address, group_name, timeout_s
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

    def push(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Announce names/dtypes/shapes over HTTP and broadcast the tensors in that order."""
        if self.group is None:
            self.connect()
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
        self.backend.weight_version = str(version)
