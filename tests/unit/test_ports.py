"""`cellar.devtools.ports.free_port`: a port below the kernel's ephemeral range (so no
outgoing connection can take it before the child binds it), free when returned."""

from __future__ import annotations

import socket

from cellar.devtools import ports


def test_free_ports_are_below_the_ephemeral_range_and_bind() -> None:
    top = ports._ephemeral_start()  # noqa: SLF001 - the bound under test
    got = {ports.free_port() for _ in range(20)}
    assert len(got) > 1  # chosen at random, not one fixed port
    for port in got:
        assert ports.LOWEST_PORT <= port < top
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_returned(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # every random pick lands on the taken port: the kernel's choice is the fallback
        monkeypatch.setattr(ports._random, "randrange", lambda lo, hi: taken)  # noqa: SLF001
        port = ports.free_port()
        assert port != taken
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
