"""TCP ports for the servers the engine tests start, chosen below the kernel's ephemeral range.

A port found with ``bind(("localhost", 0))`` lies in the ephemeral range (Linux: 32768-60999). When the
server that is meant to listen on it binds it only later, the kernel may hand the same port in between to
any socket that binds port 0 or connects out: a gRPC server of a Beam job server, an SDK worker, a
client. The Spark driver binds its UI port (``spark.ui.port``) only when a job starts, so in one CI run
that port was held by a gRPC server (Spark's driver moved to the next port, and the test polled the gRPC
server). A port below the ephemeral range is never handed out that way: once it is free when chosen it
stays free for the server that is given it (nothing else on the machine binds a fixed port there).

``python -m tests.support.ports NAME...`` prints ``NAME=port`` lines (``.ci/engines.sh``'s ports.env).
"""

from __future__ import annotations

import random
import socket
import sys

__all__ = ["ephemeral_range", "free_ports", "free_port"]

LOWEST = 10_000  # below this, well-known and registered service ports


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (``net.ipv4.ip_local_port_range``; IANA's 49152-65535 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def free_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct ports in [LOWEST, start of the ephemeral range) that nothing listens on now."""
    rng = rng or random.SystemRandom()
    low = ephemeral_range()[0]
    if low - LOWEST < 100 * n:
        raise RuntimeError(f"the ephemeral range starts at {low}: too few fixed ports below it for {n} servers")
    chosen: list[int] = []
    held = []
    try:
        while len(chosen) < n:
            port = rng.randrange(LOWEST, low)
            if port in chosen:
                continue
            s = socket.socket()
            try:
                s.bind(("localhost", port))
            except OSError:  # in use
                s.close()
                continue
            held.append(s)  # held until all are chosen
            chosen.append(port)
    finally:
        for s in held:
            s.close()
    return chosen


def free_port() -> int:
    """One port in [LOWEST, start of the ephemeral range) that nothing listens on now."""
    return free_ports(1)[0]


if __name__ == "__main__":
    names = sys.argv[1:]
    for name, port in zip(names, free_ports(len(names))):
        print(f"{name}={port}")
