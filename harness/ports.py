"""Free TCP ports for the servers and process groups harness starts on this machine."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below: well-known and registered services


def _ephemeral_floor() -> int:
    """Where the kernel's ephemeral range starts (Linux default 32768)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now, drawn below the kernel's ephemeral range.

    Asking the kernel for port 0 returns an ephemeral port, which any outgoing connection (an HTTP
    client, another run's engine) may take as its local port between this check and our server's
    bind; ports below the ephemeral range are only taken by explicit binds. (The EADDRINUSE seen
    in the test suite had another cause, an inherited ``MASTER_PORT``: see :func:`child_env`.)
    Falls back to port 0 where that range is empty or full."""
    floor = _ephemeral_floor()
    draw = random.SystemRandom()
    for _ in range(64):
        if floor <= _LOWEST:
            break
        port = draw.randrange(_LOWEST, floor)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) without the torch.distributed rendezvous
    variables, for a child process that starts runs of its own. A process that trained in
    process set ``MASTER_PORT`` for its single-process group, whose store still listens there
    (DeepSpeed keeps its groups), so a child inheriting it fails with EADDRINUSE."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k not in RENDEZVOUS_VARIABLES}


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, for a server that says where it serves
    only once it does: a port out of range is a ValueError, one in use or not allowed an OSError,
    each naming the address (uvicorn would wrap 99999 round to 34463, or log the bind failure
    after the caller had announced the server)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is not a TCP port (1 to 65535)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def serve_app(app: Any, host: str, port: int, ready: Callable[[str], None] | None = None, **config: Any) -> None:
    """Serve the ASGI ``app`` with uvicorn on ``host:port`` in the foreground (Ctrl-C stops it):
    the socket is bound first (:func:`listening_socket`), then ``ready(url)`` is called (the
    "serving ..." line), then uvicorn runs on it. ``config``: more ``uvicorn.Config`` options."""
    # deferred: uvicorn costs ~0.1 s at import, only for a server
    import uvicorn

    sock = listening_socket(host, port)
    if ready is not None:
        ready(f"http://{host}:{port}")
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, **config)).run(sockets=[sock])
