"""schemathesis against a real `filterforward cloud serve`: every check (no server error, responses and status
codes as documented in /openapi.json, schema-valid requests accepted and invalid ones refused, Allow headers,
auth), a fixed seed and a bounded number of examples per operation, over a database that holds a filter, an
edge, a camera and events with frames, so the id paths reach real rows."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from cloud_server import READ_WRITE, CloudServer, run_cloud

from cloud.db import make_engine, session_factory
from cloud.framestore import FrameStore
from cloud.storage import Storage
from common.protocol import EventHeader, EventInfo, FrameHeader, Hello

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = 15  # per operation and phase: enough to find the classes of bad input, bounded for CI


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory, make_filter) -> Iterator[CloudServer]:
    with run_cloud(tmp_path_factory.mktemp("fuzz")) as server:
        spec, onnx = make_filter("full_frame", "late", (128, 96), name="red-car")
        with server.client() as client:
            files = {"model": ("m.onnx", onnx, "application/octet-stream")}
            assert client.post("/api/filters", data={"spec": spec.model_dump_json()}, files=files).status_code == 201
        config = server.config
        storage = Storage(session_factory(make_engine(config.db_url)), FrameStore(config.data_dir / "frames"))
        storage.edge_hello("edge-1", Hello(edge="edge-1", run="run-1", cameras=["cam-1"]), None)
        jpeg = cv2.imencode(".jpg", np.zeros((96, 128, 3), np.uint8))[1].tobytes()
        info = EventInfo(id="ev-1", filter="red-car", camera="cam-1", start_frame=1, start_time=0.1, peak_score=0.9)
        storage.store_event("edge-1", EventHeader(edge="edge-1", run="run-1", seq=1, phase="start",
                                                  wall_time=1.7e9, event=info), b"")  # fmt: skip
        for seq in (2, 3):
            header = FrameHeader(edge="edge-1", run="run-1", seq=seq, camera="cam-1", frame=seq, timestamp=seq / 10,
                                 wall_time=1.7e9 + seq, scores={"red-car": 0.9}, events=["ev-1"])  # fmt: skip
            storage.store_frame("edge-1", header, jpeg)
        yield server


def test_the_api_keeps_its_openapi_contract_under_generated_requests(populated: CloudServer, tmp_path: Path) -> None:
    command = [
        Path(sys.executable).with_name("st"), "--no-color", "--config-file", str(CONFIG),
        "run", f"{populated.url}/openapi.json", "--checks", "all", "--seed", "1", "--max-examples", str(EXAMPLES),
        "--workers", "1", "--header", f"Authorization: Bearer {READ_WRITE}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:]
    assert populated.log_text().count("Traceback") == 0, populated.log_text()[-4000:]
