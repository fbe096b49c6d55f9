"""harness.ports.free_port: a bindable port below the kernel's ephemeral range."""

from __future__ import annotations

import socket

from harness import ports


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    floor = ports._ephemeral_floor()
    for _ in range(20):
        port = ports.free_port()
        assert ports._LOWEST <= port < floor
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_returned(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "_LOWEST", taken)
        monkeypatch.setattr(ports, "_ephemeral_floor", lambda: taken + 2)  # candidates: taken, taken + 1
        for _ in range(10):
            assert ports.free_port() != taken
