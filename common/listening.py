"""Why a server could not listen on HOST:PORT, in words that name the setting to change."""

from __future__ import annotations

import errno
import os
import socket

from models.errors import FilterForwardError


def cannot_listen(
    what: str, host: str, port: int, exc: OSError, port_setting: str, host_setting: str
) -> FilterForwardError:
    """The error for a failed bind: a host this machine does not have, a privileged port, or a port in use."""
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        hint = f"set {host_setting} to an address of this machine (0.0.0.0: all of them, 127.0.0.1: this one only)"
    elif exc.errno == errno.EACCES:
        hint = f"ports below 1024 need root: set {port_setting} to 1024 or above"
    else:
        hint = f"set {port_setting} to a free port or stop what is using it"
    # os.strerror: socket.create_server appends the address to the OS's words; a resolver error's errno is negative.
    reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
    return FilterForwardError(f"cannot {what} on {host}:{port} ({reason}): {hint}")
