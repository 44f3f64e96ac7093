"""The cloud's ZeroMQ server sockets (the ingest's ROUTER, the publisher's PUB): bound on `zmq.bind`, CURVE
servers unless insecure (the edges' keys checked by the context's ZAP handler, cloud.zap), and a bound on the
size of what a peer may send."""

from __future__ import annotations

import zmq

from cloud.config import ZmqConfig
from common.curve import make_server
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
    if not config.insecure:
        make_server(socket, config.secret_key)
    address = f"tcp://{config.bind}:{port or '*'}"
    try:
        socket.bind(address)
    except zmq.ZMQError as exc:
        raise FilterForwardError(
            f"cannot bind zmq.{setting} to {address} ({exc}): pick a free port or stop what is using it"
        ) from None
