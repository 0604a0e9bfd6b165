"""Loopback ports for the processes the fork starts (tensor-parallel rendezvous, test servers)."""

import socket


def get_open_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (the OS picks it; it is released before
    the caller binds it, so a rare race with another process remains)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
