"""systemd's readiness protocol (sd_notify) with the standard library: one datagram a state.

Under `Type=notify` systemd passes NOTIFY_SOCKET (a path, or `@name` in the abstract namespace)
and waits for `READY=1` before it counts the service as started; `STOPPING=1` tells it a drain
has begun. Without NOTIFY_SOCKET this does nothing.
"""

from __future__ import annotations

import os
import socket


def sd_notify(state: str, env: dict[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1\\nMAINPID=123"); True when a socket took it."""
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False
    target = "\0" + address[1:] if address[0] == "@" else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(target)
            sock.sendall(state.encode())
        except OSError:
            return False  # systemd gone or the socket not ours: serving matters more
    return True
