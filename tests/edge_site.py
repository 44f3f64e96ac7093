"""An edge site for end-to-end tests: a cloud with CURVE keys that allow one edge, that edge's config, and
the checks on what reached the cloud. Every part runs as a real process (`filterforward ...`)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from cloud_server import REPO, CloudServer, write_config
from sqlalchemy import select

from cloud.db import Received, StoredFrame, make_engine
from edge.spool import Spool

EDGE = "edge-1"
CAMERA = "gate"
INPUT_SIZE = (384, 224)
TRAIN_FRAMES = "0:212"  # the split of tests/test_replay_eval.py; the red car passes at frames 187-238


def filterforward(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "filterforward", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@dataclass
class Site:
    """A cloud with CURVE keys that allow one edge, and that edge's config (not started)."""

    cloud: CloudServer
    edge_config: Path
    root: Path

    def register(self, bundle: Path, **overrides: object) -> dict:
        spec = {**json.loads((bundle / "spec.json").read_text()), **overrides}
        files = {"model": ("model.onnx", (bundle / "model.onnx").read_bytes(), "application/octet-stream")}
        with self.cloud.client() as client:
            response = client.post("/api/filters", data={"spec": json.dumps(spec)}, files=files)
        assert response.status_code == 201, response.text
        return response.json()

    def start_edge(self) -> subprocess.Popen:
        log = (self.root / "edge.log").open("a")
        command = [sys.executable, "-m", "filterforward", "edge", "run", "--config", str(self.edge_config)]
        return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def edge_log(self) -> str:
        return (self.root / "edge.log").read_text()

    def stored(self) -> list[StoredFrame]:
        engine = make_engine(self.cloud.config.db_url)
        try:
            with engine.connect() as connection:
                return list(connection.execute(select(StoredFrame).order_by(StoredFrame.seq)).all())
        finally:
            engine.dispose()

    def received_seqs(self) -> list[int]:
        engine = make_engine(self.cloud.config.db_url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(select(Received.seq).where(Received.edge_id == EDGE)).scalars()
                return sorted(rows)
        finally:
            engine.dispose()

    def spool(self) -> Spool:
        return Spool(self.root / "spool", 2**30)


def make_site(root: Path, source: Path | str, pacing: str, timeout: float = 15.0, **cloud_settings: object) -> Site:
    keys = root / "keys"
    for name in ("cloud", EDGE):
        result = filterforward("keys", "create", name, "--dir", str(keys))
        assert result.returncode == 0, result.stderr
    (keys / "edges").mkdir()
    (keys / "edges" / f"{EDGE}.key").write_bytes((keys / f"{EDGE}.key").read_bytes())
    zmq = {
        "insecure": False,
        "secret_key": str(keys / "cloud.key_secret"),
        "edge_keys": str(keys / "edges"),
        "heartbeat": 0.5,
    }
    cloud = CloudServer(write_config(root, zmq=zmq, **cloud_settings), root / "cloud.log")
    settings = cloud.config.zmq
    edge = {
        "edge_id": EDGE,
        "input_size": list(INPUT_SIZE),
        "cameras": [{"name": CAMERA, "source": str(source), "pacing": pacing}],
        "cloud": {
            "address": "127.0.0.1",
            "ingest_port": settings.ingest_port,
            "publish_port": settings.publish_port,
            "server_key": str(keys / "cloud.key"),
            "secret_key": str(keys / f"{EDGE}.key_secret"),
            "heartbeat": 0.5,
            "timeout": timeout,
        },
        "spool": {"path": str(root / "spool")},
        "stats_interval": 1,
    }
    edge_config = root / "edge.yaml"
    edge_config.write_text(yaml.safe_dump(edge))
    return Site(cloud, edge_config, root)


def finish(site: Site, edge: subprocess.Popen) -> None:
    """Wait for the edge to reach the end of its clip and exit cleanly."""
    try:
        assert edge.wait(timeout=180) == 0, site.edge_log()
    finally:
        if edge.poll() is None:
            edge.kill()


def assert_exactly_once(site: Site) -> None:
    spool = site.spool()
    try:
        assert spool.messages == 0, "the edge exited with unacknowledged messages"
        first = site.received_seqs()
        assert first == list(range(first[0], spool.last_seq + 1)), "a message the edge spooled never arrived"
    finally:
        spool.close()
    frames = site.stored()
    assert len({f.seq for f in frames}) == len(frames)
