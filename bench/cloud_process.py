"""The cloud service as its own process for the benchmarks, as operators run it: a config on free loopback
ports, `filterforward cloud serve`, ready once /healthz answers. (The benchmarks run as scripts, so they
import this module as a sibling.)"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

START_TIMEOUT_S = 60.0  # the cloud answers well within this; only a broken setup reaches it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_cloud_config(folder: Path, token: str, zmq: dict[str, Any], **settings: Any) -> Path:
    """folder/cloud.yaml: HTTP and both ZeroMQ sockets on free loopback ports, one read+write `token`."""
    config = {
        "data_dir": str(folder / "cloud"),
        "host": "127.0.0.1",
        "port": free_port(),
        "tokens": [{"name": "bench", "token": token, "scopes": ["read", "write"]}],
        "zmq": {"bind": "127.0.0.1", "ingest_port": free_port(), "publish_port": free_port(), **zmq},
        **settings,
    }
    path = folder / "cloud.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_healthy(url: str, process: subprocess.Popen, log_path: Path) -> None:
    """Until `url`/healthz answers 200; SystemExit naming the log if the process dies or never answers."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the cloud did not come up; see {log_path}")
