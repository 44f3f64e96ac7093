"""`filterforward cloud`: run the cloud service (REST API, web page, ZeroMQ ingest) from its YAML config."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
from contextlib import ExitStack
from pathlib import Path

from common.listening import cannot_listen

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cloud", help="run the cloud service: filter registry, ingest, events, web page")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve_parser = actions.add_parser(
        "serve",
        help="serve the REST API and web page and receive the edges' matched frames",
        description="Starts the HTTP service (REST API under /api, OpenAPI docs at /docs, the web page at /) and "
        "the ZeroMQ ingest the edges connect to (zmq.ingest_port) with the filter updates they subscribe to "
        "(zmq.publish_port). Stops cleanly on Ctrl-C/SIGTERM.",
    )
    serve_parser.add_argument("--config", type=Path, required=True, help="cloud YAML file")
    serve_parser.add_argument("--host", help="HTTP bind address (overrides the config's host)")
    serve_parser.add_argument("--port", type=_port, help="HTTP port (overrides the config's port)")
    serve_parser.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    from cloud.config import load_cloud_config

    overrides = {key: value for key, value in (("host", args.host), ("port", args.port)) if value is not None}
    config = load_cloud_config(args.config, overrides)  # a bad file fails here, before the heavy imports
    import uvicorn

    from cloud.app import create_app, start_services

    with ExitStack() as stack:  # the ingest, notifier and sweeps stop after the HTTP server
        listening = stack.enter_context(_listen(config.host, config.port))
        services = start_services(config, stack)
        log.info("cloud service at http://%s:%d (API docs at /docs)", config.host, config.port)
        # uvicorn handles SIGINT/SIGTERM while it runs (stops accepting, finishes open requests, runs the app's
        # shutdown), then raises the signal again under the handlers it found: these absorb it, so a clean
        # shutdown exits with 0 rather than as killed.
        for handled in (signal.SIGINT, signal.SIGTERM):
            signal.signal(handled, lambda *_: None)
        server = uvicorn.Server(uvicorn.Config(create_app(config, services), log_config=None, access_log=False))
        server.run(sockets=[listening])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """The HTTP server's socket, bound before anything starts: a port in use is one line, not a failed start."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise cannot_listen("listen", host, port, exc, "port (or --port)", "host (or --host)") from None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)
