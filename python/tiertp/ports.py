"""A free TCP port, for the processes tiertp and its tests start."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on now. Another process may take it before the
    caller binds it; callers that start a listener on it say so if it fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
