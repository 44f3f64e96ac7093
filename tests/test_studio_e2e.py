"""The filter studio's whole loop over REST only, every part a real process on loopback (docs/studio.md): footage
requested from an edge camera replaying a synthetic clip in real time, labelled (from the clip's ground truth, at the
camera frames the footage names), trained by `filterforward trainer serve`, deployed with one call, and the edge then
reporting events of the new filter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from cloud_server import READ_WRITE, REPO
from edge_site import CAMERA, EDGE, INPUT_SIZE, Site, finish, make_site
from support import wait_until

from models.datasets import LabelledDataset, write_synthetic

EVENT = "any_object"
FPS = 20.0
TRAINER_TOKEN = "studio-e2e-trainer-token-5678"
TOKENS = [
    {"name": "operator", "token": READ_WRITE, "scopes": ["read", "write"]},
    {"name": "trainer", "token": TRAINER_TOKEN, "scopes": ["train"]},
]


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> LabelledDataset:
    # 3 min in real time: footage, training and deployment happen while the camera keeps playing, with room for a
    # slow machine (about 40 s on an idle 2-core one); the edge is stopped once the new filter's event arrived
    return write_synthetic(tmp_path_factory.mktemp("clip"), n_frames=3600, size=(192, 128), fps=FPS, seed=3)


@pytest.fixture
def site(tmp_path: Path, clip: LabelledDataset) -> Iterator[Site]:
    site = make_site(tmp_path, clip.source, "realtime", tokens=TOKENS, max_upload_bytes=2**21)
    site.cloud.start()
    try:
        yield site
    finally:
        if site.cloud.process and site.cloud.process.poll() is None:
            site.cloud.stop()


def run_trainer(site: Site) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "filterforward", "trainer", "serve", "--cloud", site.cloud.url, "--once"]
    command += ["--name", "trainer-1", "--work", str(site.root / "trainer")]
    env = {**os.environ, "FF_TRAINER_TOKEN": TRAINER_TOKEN}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_footage_to_deployed_filter_over_rest(site: Site, clip: LabelledDataset) -> None:
    edge = site.start_edge()
    started = time.monotonic()
    try:
        with site.cloud.client() as client:
            wait_until(lambda: any(e["id"] == EDGE for e in client.get("/api/edges").json()), "the edge's hello")
            body = {"name": "gate", "edge": EDGE, "camera": CAMERA, "every": 0, "duration": 30, "max_frames": 160}
            assert client.post("/api/datasets/footage", json=body).status_code == 201
            wait_until(lambda: client.get("/api/datasets/gate").json()["status"] == "complete", timeout=120)
            # The person labelling: the clip's ground truth at the camera frames the footage holds. labels.csv is
            # rewritten just after the footage's end is stored, so it may lag the status by a moment.
            frames = client.get("/api/datasets/gate").json()["frames"]
            csv = site.cloud.config.data_dir / "datasets/gate/labels.csv"
            wait_until(lambda: len(csv.read_text().splitlines()) == 1 + frames, "labels.csv with every frame")
            rows = np.loadtxt(csv, delimiter=",", skiprows=1)
            camera_frames = rows.reshape(-1, 2)[:, 1].astype(int)
            truth = clip.labels[EVENT][camera_frames]
            labels = [{"frame": n, "value": int(value)} for n, value in enumerate(truth)]
            assert client.put("/api/datasets/gate/labels", json={"event": EVENT, "labels": labels}).status_code == 200
            job = client.post("/api/training-jobs", json={"dataset": "gate", "event": EVENT, "filter": "gate-object"})
            assert job.status_code == 201, job.text
            assert job.json()["options"]["input_size"] == list(INPUT_SIZE)  # the edge's, from its hello
            trained = run_trainer(site)
            assert trained.returncode == 0, trained.stdout + trained.stderr
            done = client.get(f"/api/training-jobs/{job.json()['id']}").json()
            assert done["status"] == "done", done
            deployed = client.post(f"/api/training-jobs/{done['id']}/deploy")
            assert deployed.status_code == 200, deployed.text
            assert deployed.json()["spec"]["cameras"] == [CAMERA]
            wait_until(
                lambda: client.get("/api/events", params={"filter": "gate-object"}).json()["items"],
                "an event of the new filter",
                timeout=120,
            )
            print(f"footage request to an event of the deployed filter: {time.monotonic() - started:.0f} s")
    finally:
        finish(site, edge, stop=True)
    assert "Traceback" not in site.cloud.log_text() and "Traceback" not in site.edge_log()
