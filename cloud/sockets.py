"""The cloud's ZeroMQ server sockets (the ingest's ROUTER, the publisher's PUB): bound on `zmq.bind`, CURVE
servers unless insecure (the edges' keys checked by the context's ZAP handler, cloud.zap), and a bound on the
size of what a peer may send."""

from __future__ import annotations

import zmq

from cloud.config import ZmqConfig
from common.curve import make_server
from common.endpoints import ipv6_literal, tcp_endpoint
from models.errors import FilterForwardError

HEADER_ROOM = 1024 * 1024  # bytes allowed for any message part but a payload (headers are a few hundred)


def bind_server(
    context: zmq.Context, config: ZmqConfig, kind: int, port: int, setting: str, max_message: int
) -> tuple[zmq.Socket, int]:
    """A socket of `kind` bound to `port` (config key `setting`, 0 for any free one), and the port it got. A peer
    sending a message part over `max_message` bytes is disconnected before the part is buffered."""
    socket = context.socket(kind)
    try:
        _listen(socket, config, port, setting, max_message)
    except BaseException:
        socket.close()  # an open socket would keep the context's term() waiting for ever
        raise
    return socket, int(socket.last_endpoint.rsplit(b":", 1)[1])


def _listen(socket: zmq.Socket, config: ZmqConfig, port: int, setting: str, max_message: int) -> None:
    socket.linger = 0
    socket.maxmsgsize = max_message
    socket.ipv6 = ipv6_literal(config.bind) is not None
    if not config.insecure:
        make_server(socket, config.secret_key)
    address = tcp_endpoint(config.bind, port or "*")
    try:
        socket.bind(address)
    except zmq.ZMQError as exc:
        hint = (
            f"pick a free zmq.{setting} or stop what is using it"
            if exc.errno == zmq.EADDRINUSE
            else "set zmq.bind to an address of this machine (0.0.0.0 or :: for all of them, 127.0.0.1 or ::1 for "
            "this one only)"
        )
        raise FilterForwardError(f"cannot bind zmq.{setting} to {address} ({exc}): {hint}") from None
