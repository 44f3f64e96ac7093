"""`filterforward cloud serve` as a user runs it: one-line errors for bad configs, overrides, clean shutdown."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cloud_server import REPO, write_config
from support import free_port

from filterforward.cli import main

GOOD_ZMQ = "zmq: {insecure: true, ingest_port: 15555, publish_port: 15556}\n"
TOKENS = "tokens: [{name: ops, token: a-token-of-sixteen-chars}]\n"


def serve(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "filterforward", "cloud", "serve", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        (TOKENS + GOOD_ZMQ + "colour: red\n", "colour: unknown key; the keys allowed here are:"),
        (GOOD_ZMQ, "tokens: required key is missing"),
        (TOKENS + "zmq: {ingest_port: 15555}\n", "set zmq.secret_key and zmq.edge_keys"),
        (TOKENS + GOOD_ZMQ + "port: 0\n", "port: Input should be greater than or equal to 1"),
        (
            TOKENS + GOOD_ZMQ + "database_url: ${FF_TEST_UNSET_DATABASE}\n",
            "the environment has no FF_TEST_UNSET_DATABASE",
        ),
        ("tokens: [unclosed\n", "is not valid YAML"),
        (TOKENS + GOOD_ZMQ + "database_url: mysql://ff@db/ff\n", "mysql is not supported: use postgresql"),
        (TOKENS + GOOD_ZMQ + "database_url: postgresql+psycopg2://ff@db/ff\n", "the driver postgresql+psycopg2 is not"),
        (TOKENS + GOOD_ZMQ + "public_url: ff.example.org\n", "public_url: Input should be a valid URL"),
        (TOKENS + GOOD_ZMQ + "mqtt: {host: ''}\n", "mqtt.host: String should have at least 1 character"),
        (
            "tokens: [{name: ops, token: a-token-of-sixteen-chars}, {name: ops, token: another-token-sixteen}]\n"
            + GOOD_ZMQ,
            "the token name 'ops' is given twice: give each token its own name",
        ),
        (
            "tokens: [{name: ops, token: a-token-of-sixteen-chars, scopes: [read, write]},"
            " {name: viewer, token: a-token-of-sixteen-chars}]\n" + GOOD_ZMQ,
            "tokens 'ops' and 'viewer' have the same secret: give each its own",
        ),
        (TOKENS + "zmq: {insecure: true, ingest_port: 15555, publish_port: 15555}\n", "both 15555: give each socket"),
        (TOKENS + GOOD_ZMQ + "port: 15556\n", "and zmq.publish_port are both 15556: give the HTTP server its own"),
        # It said "zmq: required key is missing", never the misspelt key.
        (TOKENS + "zqm: {insecure: true}\n", "line 2: zqm: unknown key (did you mean zmq?); the keys allowed here"),
    ],
    ids=[
        "unknown key",
        "no tokens",
        "no keys and not insecure",
        "bad port",
        "unset variable",
        "not YAML",
        "unsupported database",
        "database driver not installed",
        "public URL not a URL",
        "empty MQTT host",
        "a token name twice",
        "a secret twice",
        "one ZeroMQ port for both sockets",
        "the HTTP port a ZeroMQ one",
        "a required key misspelt",
    ],
)
def test_a_bad_config_is_one_line_and_exit_code_2(tmp_path: Path, text: str, detail: str) -> None:
    config = tmp_path / "cloud.yaml"
    config.write_text(text)
    result = serve("--config", str(config))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"filterforward cloud: error: config file {config}")
    assert detail in lines[0]


def test_a_missing_config_file(tmp_path: Path) -> None:
    result = serve("--config", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"filterforward cloud: error: config file {tmp_path / 'absent.yaml'} does not exist: check the path"
    )


def test_a_bad_port_option(tmp_path: Path) -> None:
    result = serve("--config", str(write_config(tmp_path)), "--port", "70000")
    assert result.returncode == 2
    assert "'70000' is not a TCP port (1-65535)" in result.stderr
    # --port is checked with the file, as its port: key is (it said zmq.ingest_port could not bind, "in use").
    (tmp_path / "clash").mkdir()
    config = write_config(tmp_path / "clash", zmq={"ingest_port": 15557})
    result = serve("--config", str(config), "--port", "15557")
    assert result.returncode == 2
    expected = "port (or --port) and zmq.ingest_port are both 15557: give the HTTP server its own port"
    assert expected in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize(
    ("settings", "detail"),
    [
        ({"zmq": {"ingest_port": "BUSY"}}, "cannot bind zmq.ingest_port to tcp://127.0.0.1:BUSY"),
        ({"port": "BUSY"}, "cannot listen on 127.0.0.1:BUSY (Address already in use): set port (or --port) to a free"),
        ({"host": "nothing.invalid"}, "): set host (or --host) to an address of this machine (0.0.0.0: all of them"),
        ({"data_dir": "/proc/no-such/data"}, "cannot create data_dir /proc/no-such/data (No such file or directory)"),
        (
            {"database_url": "postgresql+psycopg://ff:hunter2@127.0.0.1:1/ff"},
            "cannot open the database postgresql+psycopg://ff:***@127.0.0.1:1/ff (connection failed",
        ),
        ({"database_url": "nosuchdb://x"}, "database_url: nosuchdb is not supported"),  # now refused with the config
        (
            {"zmq": {"insecure": False, "secret_key": "KEYS/cloud.key_secret", "edge_keys": "KEYS/absent"}},
            "zmq.edge_keys folder KEYS/absent does not exist",
        ),
        (
            {"zmq": {"insecure": False, "secret_key": "KEYS/absent.key_secret", "edge_keys": "KEYS"}},
            "key file KEYS/absent.key_secret does not exist",
        ),
    ],
    ids=[
        "zmq port in use",
        "http port in use",
        "unknown host",
        "data_dir",
        "database down",
        "database url",
        "edge_keys",
        "secret",
    ],
)
def test_what_the_host_cannot_honour_is_one_line_and_exit_code_2(tmp_path: Path, settings: dict, detail: str) -> None:
    keys = tmp_path / "keys"
    assert main(["keys", "create", "cloud", "--dir", str(keys)]) == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        text = json.dumps(settings).replace('"BUSY"', busy).replace("KEYS", str(keys))
        result = serve("--config", str(write_config(tmp_path, **json.loads(text))))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback, no half-started service
    assert detail.replace("BUSY", busy).replace("KEYS", str(keys)) in lines[0]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_with_overrides_logs_its_addresses_and_stops_cleanly(tmp_path: Path, stop: signal.Signals) -> None:
    config = write_config(tmp_path)
    port = free_port()
    log = tmp_path / "cloud.log"
    command = [sys.executable, "-m", "filterforward", "cloud", "serve", "--config", str(config)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        assert process.poll() is None, log.read_text()
        process.send_signal(stop)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert f"cloud service at http://127.0.0.1:{port} (API docs at /docs)" in text
    assert "ingest on 127.0.0.1:" in text and "filter updates on 127.0.0.1:" in text
    assert "cloud service stopping" in text
