"""What starting any runtime's server shares: loopback addresses and free ports."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from pipeline.serving.server import ServeError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range, once per process. One the kernel picks
    (bind to 0) is ephemeral: an outgoing connection can take it before the server binds it
    (a fresh-clone CI run lost a TorchServe start so: "Address already in use")."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for port in random.sample(range(max(1024, low - 12000), low), 100):
        with socket.socket() as s:
            if port in _HANDED_OUT:
                continue
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise ServeError(f"No free port on {host} below {low}.")
