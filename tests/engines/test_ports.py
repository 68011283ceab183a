"""The engine tests' server ports (tests/support/ports.py) lie below the ephemeral range.

CI failed once because the Spark driver's UI port, chosen with bind(0) and bound only when a job started,
had been handed by the kernel to a gRPC server in between: ports below the ephemeral range cannot be."""

import random
import socket

import pytest

from tests.support import ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    low, high = ports.ephemeral_range()
    assert 1024 < low <= high
    chosen = ports.free_ports(11, random.Random(0))
    assert len(set(chosen)) == 11
    assert all(ports.LOWEST <= p < low for p in chosen), (chosen, low)
    for port in chosen:  # free: each binds now
        with socket.socket() as s:
            s.bind(("localhost", port))


def test_a_port_in_use_is_never_chosen():
    with socket.socket() as busy:
        busy.bind(("localhost", ports.free_port()))
        busy.listen()
        taken = busy.getsockname()[1]

        class Replay(random.Random):  # offers the busy port first, then others
            first = True

            def randrange(self, *args):
                if self.first:
                    self.first = False
                    return taken
                return super().randrange(*args)

        assert taken not in ports.free_ports(3, Replay(1))


def test_too_narrow_a_range_is_an_error(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST + 50, 60999))
    with pytest.raises(RuntimeError, match="too few fixed ports"):
        ports.free_ports(3)
