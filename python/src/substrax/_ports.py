"""Free local TCP ports, for rendezvous on one machine."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on now: the kernel's pick for a socket bound to port 0. Another
    program may take it before its user binds it, as with any such pick; the window is short."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
