"""An edge site for end-to-end tests: a cloud with CURVE keys that allow one edge, that edge's config, and
the checks on what reached the cloud. Every part runs as a real process (`filterforward ...`)."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml
from cloud_server import REPO, CloudServer, write_config
from sqlalchemy import select

from cloud.db import Fragment, Received, StoredFrame, make_engine
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
        return stored_rows(self.cloud, StoredFrame)

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

    def spooled(self) -> int:
        """Messages the edge left in its spool, not acknowledged by the cloud."""
        spool = self.spool()
        try:
            return spool.messages
        finally:
            spool.close()


def stored_rows(cloud: CloudServer, table: type[StoredFrame] | type[Fragment]) -> list:
    """Every row of the cloud's frames or fragments table, in seq order."""
    engine = make_engine(cloud.config.db_url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(select(table).order_by(table.seq)).all())
    finally:
        engine.dispose()


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


def finish(site: Site, edge: subprocess.Popen, stop: bool = False) -> None:
    """Wait for the edge to exit cleanly: at the end of its clip, or (`stop`) on SIGTERM now, as an operator would."""
    try:
        if stop and edge.poll() is None:
            edge.send_signal(signal.SIGTERM)
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
    assert_images(site.cloud)


def assert_images(cloud: CloudServer, complete: bool = True) -> None:
    """Each stream fragment is stored once and, read in seq order, in stream order per edge run and camera; each
    run's stream starts with a GOP (an edge restart starts a new one); every matched frame has its image (a
    JPEG, or a place in a stored fragment) and every one of them is served as a JPEG by /api/frames/{id}.jpg.
    Not `complete`: retention has deleted the oldest payloads, so only the fragments left are checked."""
    fragments = stored_rows(cloud, Fragment)
    assert len({f.seq for f in fragments}) == len(fragments), "a fragment was stored twice"
    streams: dict[tuple[str, str], list[Fragment]] = {}
    for fragment in fragments:
        streams.setdefault((fragment.run, fragment.camera), []).append(fragment)
    for stream in streams.values():
        assert stream[0].starts_gop or not complete, "a run's stream does not start with a keyframe"
        # Read in seq order (as the cloud joins and decodes them) they are the camera's stream in order. (The
        # order of storing may differ: a fragment a full disk refused is stored when resent, maybe after the
        # next one, if space was freed in between.)
        assert all(a.last_frame < b.first_frame for a, b in itertools.pairwise(stream)), "fragments out of order"
    if not complete:
        return
    frames = stored_rows(cloud, StoredFrame)
    without = [f.frame_index for f in frames if f.path is None and f.fragment_id is None]
    assert not without, f"matched frames stored without an image: {without[:10]}"
    held = {f.id: f for f in fragments}
    for frame in frames:
        if frame.fragment_id is not None:
            holder = held[frame.fragment_id]
            assert (holder.run, holder.camera) == (frame.run, frame.camera)
            assert holder.first_frame <= frame.frame_index <= holder.last_frame
    with cloud.client() as client:
        shapes = {decoded_shape(client.get(f"/api/frames/{frame.id}.jpg")) for frame in frames}
    assert len(shapes) <= 1, f"frames decoded at different sizes: {shapes}"


def decoded_shape(response) -> tuple[int, ...]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/jpeg"
    image = cv2.imdecode(np.frombuffer(response.content, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG"
    return image.shape
