"""A server that cannot listen says which setting to change: the port (in use) or the host (not this machine's)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from common.health import HealthServer
from edge.metrics import EdgeCollector, MetricsServer
from filterforward.cli import main
from models.errors import FilterForwardError


def test_a_port_in_use_names_the_port_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(FilterForwardError) as metrics:
            MetricsServer(port, EdgeCollector("edge-1", dict))
        with pytest.raises(FilterForwardError) as health:
            HealthServer("0.0.0.0", port, lambda: None)
    assert str(metrics.value) == (
        f"cannot serve metrics on 0.0.0.0:{port} (Address already in use): "
        "set metrics_port to a free port or stop what is using it"
    )
    assert str(health.value) == (
        f"cannot serve the health check on 0.0.0.0:{port} (Address already in use): "
        "set --health-port to a free port or stop what is using it"
    )


@pytest.mark.parametrize("host", ["nothing.invalid", "192.0.2.1"], ids=["no such name", "not this machine's"])
def test_a_host_this_machine_lacks_names_the_host_setting(
    host: str, short_clip: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["camera", "serve", str(short_clip), "--port", "8080", "--host", host]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"filterforward camera: error: cannot listen on {host}:8080 (")
    assert error.endswith(
        "): set --host to an address of this machine (0.0.0.0: all of them, 127.0.0.1: this one only)"
    ), error
