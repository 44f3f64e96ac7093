"""A real `filterforward cloud serve` process for tests: config on free loopback ports, start, health, stop.

Used by the API, web, uplink and end-to-end tests; also a fresh PostgreSQL schema per test module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from support import free_port

from cloud.config import CloudConfig, load_cloud_config

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
READ_WRITE = "api-test-read-write-token-0123"
READ_ONLY = "api-test-read-only-token-45678"
WRITE_ONLY = "api-test-write-only-token-9012"
MAX_UPLOAD = 100_000  # above every MC exported here (late tap at 128x96: ~47 kB)


@dataclass
class CloudServer:
    """One `filterforward cloud serve` process at a time on a fixed config: start, kill, start again."""

    config_path: Path
    log: Path
    process: subprocess.Popen | None = None

    @property
    def config(self) -> CloudConfig:
        return load_cloud_config(self.config_path)

    @property
    def url(self) -> str:
        return self.config.base_url

    def client(self, token: str | None = READ_WRITE) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def log_text(self) -> str:
        return self.log.read_text()

    def start(self) -> None:
        """Start the server (its log appended to `log`) and wait until /healthz answers."""
        with self.log.open("a") as out:
            command = [sys.executable, "-m", "filterforward", "cloud", "serve", "--config", str(self.config_path)]
            self.process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        wait_healthy(self)

    def kill(self) -> None:
        """SIGKILL: the crash case, nothing flushed."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> int:
        """SIGTERM and wait; the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def write_config(root: Path, zmq: dict[str, Any] | None = None, **settings: Any) -> Path:
    """A cloud YAML on free loopback ports with three tokens (read+write, read, write) and no CURVE."""
    zmq_settings = {"bind": "127.0.0.1", "ingest_port": free_port(), "publish_port": free_port(), "insecure": True}
    config = {
        "data_dir": "data",
        "host": "127.0.0.1",
        "port": free_port(),
        "tokens": [
            {"name": "operator", "token": READ_WRITE, "scopes": ["read", "write"]},
            {"name": "viewer", "token": READ_ONLY, "scopes": ["read"]},
            {"name": "uploader", "token": WRITE_ONLY, "scopes": ["write"]},
        ],
        "zmq": {**zmq_settings, **(zmq or {})},
        "max_upload_bytes": MAX_UPLOAD,
        **settings,
    }
    path = root / "cloud.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def run_cloud(root: Path, **settings: Any) -> Iterator[CloudServer]:
    """`python -m filterforward cloud serve` until /healthz answers; SIGTERM after, which must exit cleanly."""
    server = CloudServer(write_config(root, **settings), root / "cloud.log")
    server.start()
    try:
        yield server
    finally:
        returncode = server.stop()
    assert returncode == 0, f"cloud server exited with {returncode}:\n{server.log_text()}"


@contextmanager
def run_cloud_on(database: str, root: Path, **settings: Any) -> Iterator[CloudServer]:
    """run_cloud on "sqlite" (its file in data_dir) or "postgresql" (a fresh schema, dropped afterwards)."""
    if database == "sqlite":
        with run_cloud(root, **settings) as server:
            yield server
    else:
        with postgres_schema() as url, run_cloud(root, database_url=url, **settings) as server:
            yield server


def wait_healthy(server: CloudServer) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.process is None or server.process.poll() is not None:
            pytest.fail(f"cloud server is not running:\n{server.log_text()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"cloud server did not answer /healthz within 60 s:\n{server.log_text()}")


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A SQLAlchemy URL whose tables live in a fresh PostgreSQL schema, dropped afterwards."""
    schema = f"ff_api_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


TRAINER_TIMEOUT = 600  # seconds; only keeps a broken trainer from hanging a test


def start_trainer(cloud: CloudServer, token: str, base_model: Path, work: Path, name: str) -> subprocess.Popen:
    """`filterforward trainer serve --once` (takes one job, trains it, reports, exits) as its own process, with a
    train-scope token, its log in work/<name>.log."""
    work.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "filterforward", "trainer", "serve", "--cloud", cloud.url, "--once"]
    command += ["--name", name, "--work", str(work), "--base-model", str(base_model), "--poll", "0.5"]
    env = {**os.environ, "FF_TRAINER_TOKEN": token}
    with (work / f"{name}.log").open("w") as log:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish_trainer(process: subprocess.Popen, work: Path, name: str) -> None:
    """Wait for a trainer started by start_trainer; it must exit 0 (its job done)."""
    try:
        returncode = process.wait(timeout=TRAINER_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert returncode == 0, (work / f"{name}.log").read_text()


def job_model(cloud: CloudServer, job_id: int) -> bytes:
    """A training job's model as the cloud stored it (straight from the database: the API does not serve it)."""
    from cloud.db import TrainingJob, make_engine, session_factory

    engine = make_engine(cloud.config.db_url)
    try:
        with session_factory(engine)() as session:
            return session.get(TrainingJob, job_id).onnx
    finally:
        engine.dispose()
