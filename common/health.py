"""A service's health endpoint for container health checks: `GET /healthz` answers 200 while `check()` finds nothing
wrong, else 503 with what is wrong (one line). One daemon thread; the standard library only."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common.listening import cannot_listen

HEALTH_PATH = "/healthz"


class HealthServer:
    """Serves `check` (None: healthy; a string: why not) on host:port until close()."""

    def __init__(self, host: str, port: int, check: Callable[[], str | None]) -> None:
        handler = type("HealthHandler", (_Handler,), {"check": staticmethod(check)})
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise cannot_listen(
                "serve the health check", host, port, exc, "--health-port", "the host it binds"
            ) from None
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    check: Callable[[], str | None]

    def do_GET(self) -> None:
        if self.path != HEALTH_PATH:
            self.send_error(404, f"no such path: health is at {HEALTH_PATH}")
            return
        problem = self.check()
        body = (problem or "ok").encode()
        self.send_response(503 if problem else 200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        """Probes every few seconds would flood the service's log."""
