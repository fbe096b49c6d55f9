"""Admission that does not depend on timing: a collector's clients advance in lockstep.

A continuously batching backend admits whatever requests are waiting at a step boundary. Which
those are depends on timing: an agent that finished a turn may send its next one before the
boundary or after it, so the rows that share a forward (and its padding) differ from run to run,
and the float sums over a different batch can flip a sampled token where two were nearly tied.
An RL run's rollouts then differ now and then between two runs of the same seed.

:class:`Lockstep` removes the timing. A collector (RL rollouts) declares its clients, the
coroutines that each run one trajectory, and how many run at once; each client marks its requests
with a key (:func:`client`) that orders it, and says when it has ended (:meth:`Lockstep.done`).
The backend then admits only at a boundary where every client that is running has its request
either waiting or decoding, none still between two requests, and admits the waiting ones in the
order of their keys. Which rows share each forward is then a function of the tokens alone.

The price: a decode step waits for the agents' own work between turns (parsing, a retrieval), which
continuous batching would otherwise overlap with it. With an in-process retriever that is
milliseconds a turn: on the demo's rollouts no cost could be measured
(``scripts/perf/rollout_lockstep.py``, docs/training.md "Reproducible rollouts").
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

_client_key: contextvars.ContextVar[Any] = contextvars.ContextVar("harness_lockstep_client", default=None)


@contextlib.contextmanager
def client(key: Any) -> Iterator[None]:
    """Mark the requests the current coroutine sends with ``key`` (orderable: e.g. a tuple of ints).
    Each asyncio task has its own context, so concurrent clients do not see each other's keys."""
    token = _client_key.set(key)
    try:
        yield
    finally:
        _client_key.reset(token)


def current_client() -> Any:
    """The key :func:`client` set for the running coroutine, or None."""
    return _client_key.get()


class Lockstep:
    """``clients`` coroutines, at most ``concurrency`` running at once, each started as soon as one
    before it ends (the bounded loop of :func:`pipelines.concurrency.run_bounded`). Thread-safe:
    clients end on the event loop's thread, the backend reads it on its worker thread."""

    def __init__(self, clients: int, concurrency: int) -> None:
        if clients < 0 or concurrency < 1:
            raise ValueError(f"lockstep needs clients >= 0 and concurrency >= 1, got {clients} and {concurrency}")
        self.clients = clients
        self.concurrency = concurrency
        self._ended = 0
        self._lock = threading.Lock()

    def done(self) -> None:
        """One client has ended (call it however the client ended, also on an error)."""
        with self._lock:
            self._ended += 1

    @property
    def running(self) -> int:
        """How many clients are running now, or about to (one takes the place of each that ends)."""
        with self._lock:
            return max(0, min(self.concurrency, self.clients - self._ended))


def lockstep_of(backend: Any, clients: int, concurrency: int) -> contextlib.AbstractContextManager[Lockstep]:
    """``backend.lockstep(clients, concurrency)`` (:meth:`harness.backends.base.BackendBase.lockstep`),
    or a gate with no effect for a backend without one (a test's stand-in)."""
    start = getattr(backend, "lockstep", None)
    return start(clients, concurrency) if start is not None else contextlib.nullcontext(Lockstep(clients, concurrency))
