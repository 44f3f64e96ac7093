"""Footage from an edge camera into a cloud dataset, end to end with real processes on loopback (`filterforward cloud
serve`, `filterforward edge run` replaying a synthetic clip in real time, CURVE keys): the REST request reaches the
edge over its link, the frames come back over the uplink exactly once, and the dataset folder is one the CLI reads."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from edge_site import CAMERA, EDGE, Site, filterforward, finish, make_site
from sqlalchemy.orm import sessionmaker
from support import wait_until

from cloud.dataset_folders import DatasetFolders
from cloud.datasets import Datasets
from cloud.db import Dataset, make_engine, session_factory
from cloud.framestore import FrameStore
from cloud.storage import Message, Storage
from common.protocol import FootageHeader
from models.datasets import open_dataset, write_synthetic

FPS = 10.0
SIZE = (192, 128)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clip")
    write_synthetic(folder, n_frames=600, size=SIZE, fps=FPS)  # 60 s in real time: room for two requests
    return folder / "video.mp4"


@pytest.fixture
def site(tmp_path: Path, clip: Path) -> Iterator[Site]:
    site = make_site(tmp_path, clip, "realtime")
    site.cloud.start()
    try:
        yield site
    finally:
        if site.cloud.process and site.cloud.process.poll() is None:
            site.cloud.stop()


def dataset(site: Site, name: str) -> dict:
    with site.cloud.client() as client:
        return client.get(f"/api/datasets/{name}").json()


def request(site: Site, name: str, **settings: object) -> dict:
    body = {"name": name, "edge": EDGE, "camera": CAMERA, **settings}
    with site.cloud.client() as client:
        answer = client.post("/api/datasets/footage", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_footage_request_becomes_a_dataset(site: Site, clip: Path) -> None:
    edge = site.start_edge()
    try:
        with site.cloud.client() as client:
            wait_until(lambda: any(e["id"] == EDGE and CAMERA in e["cameras"] for e in client.get("/api/edges").json()))
            unknown = client.post("/api/datasets/footage", json={"name": "x", "edge": EDGE, "camera": "door"})
        assert unknown.status_code == 404 and "has no camera 'door'" in unknown.json()["detail"]

        assert request(site, "gate-sample", every=0.5, duration=4.0, max_frames=100)["status"] == "requested"
        wait_until(lambda: dataset(site, "gate-sample")["status"] == "complete", timeout=60)
        # Deleted and asked again under its name: a new request for the edge, recorded afresh (max_frames bounds it).
        with site.cloud.client() as client:
            assert client.delete("/api/datasets/gate-sample").status_code == 204
        request(site, "gate-sample", every=0.0, duration=10.0, max_frames=6)
        wait_until(lambda: dataset(site, "gate-sample")["status"] == "complete", timeout=60)
    finally:
        finish(site, edge, stop=True)

    again = dataset(site, "gate-sample")
    assert (again["frames"], again["expected"], again["width"], again["height"]) == (6, 6, *SIZE)
    assert again["fps"] == pytest.approx(FPS, rel=0.01)  # every frame: the camera's rate, from the timestamps
    folder = site.cloud.config.data_dir / "datasets" / "gate-sample"
    with site.cloud.client() as client:
        labels = [{"frame": n, "value": int(n >= 3)} for n in range(6)]
        assert (
            client.put("/api/datasets/gate-sample/labels", json={"event": "car", "labels": labels}).status_code == 200
        )
        frames = [client.get(f"/api/datasets/gate-sample/frames/{n}.jpg").content for n in range(6)]
    read = open_dataset(folder)
    assert read.n_frames == 6 and read.fps == pytest.approx(FPS, rel=0.01)
    np.testing.assert_array_equal(read.labels["car"], [0, 0, 0, 1, 1, 1])
    camera_frames = np.loadtxt(folder / "labels.csv", delimiter=",", skiprows=1, dtype=int)[:, -1]
    assert np.all(np.diff(camera_frames) == 1), camera_frames  # every frame: consecutive camera frames
    for data, (_, image) in zip(frames, read.frames(0, 6), strict=True):
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert decoded.shape == (SIZE[1], SIZE[0], 3)
        assert np.abs(decoded.astype(int) - image.astype(int)).mean() < 1  # the same JPEG the folder holds
    assert "Traceback" not in site.cloud.log_text() and "Traceback" not in site.edge_log()
    # The folder as the cloud keeps it trains with the CLI unchanged.
    out = site.root / "bundle"
    trained = filterforward("train", str(folder), "--event", "car", "--arch", "full_frame", "--frames", "0:6",
                            "--input-size", "192x128", "--steps", "20", "--out", str(out))  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert (out / "spec.json").is_file() and (out / "model.onnx").is_file()


def footage_storage(folder: Path) -> tuple[sessionmaker, Datasets, Storage]:
    """A cloud's database, datasets and storage in `folder`, as the ingest stores footage messages."""
    sessions = session_factory(make_engine(f"sqlite:///{folder / 'cloud.db'}"))
    datasets = Datasets(sessions, DatasetFolders(folder / "datasets"))
    return sessions, datasets, Storage(sessions, FrameStore(folder / "store"), datasets)


def test_footage_completed_by_a_frame_resent_after_its_done_message(tmp_path: Path) -> None:
    """A frame that failed to store comes back after the request's done message: the batch that stores it completes
    the dataset, which then gets the camera's rate and a labels.csv of every frame."""
    sessions, datasets, storage = footage_storage(tmp_path)
    with sessions.begin() as session:
        session.add(Dataset(name="gate", source="footage", status="recording", edge_id=EDGE, camera=CAMERA,
                            request="gate-1a2b", every=0.0, fps=0.0, regions={}))  # fmt: skip
    jpeg = cv2.imencode(".jpg", np.zeros((48, 64, 3), np.uint8))[1].tobytes()

    def footage(seq: int, number: int, done: bool = False) -> Message:
        header = FootageHeader(edge=EDGE, run="r", seq=seq, request="gate-1a2b", camera=CAMERA, number=number,
                               frame=40 + number, timestamp=number / FPS, done=done, frames=3 if done else None,
                               payload="none" if done else "jpeg")  # fmt: skip
        return Message(EDGE, header, b"" if done else jpeg)

    first = storage.store_many([footage(1, 0), footage(2, 1), footage(4, 3, done=True)])
    assert first.outcomes == ["stored"] * 3 and first.completed == []
    resent = storage.store_many([footage(3, 2)])
    assert resent.completed == ["gate"]
    datasets.footage_complete("gate")
    with sessions() as session:
        row = datasets.get(session, "gate")
        assert (row.status, row.frames, row.expected) == ("complete", 3, 3)
        assert row.fps == FPS
    folder = tmp_path / "datasets" / "gate"
    camera_frames = np.loadtxt(folder / "labels.csv", delimiter=",", skiprows=1, dtype=int, ndmin=2)[:, -1]
    assert camera_frames.tolist() == [40, 41, 42]  # every frame, the resent one included
    assert f"fps: {FPS}" in (folder / "dataset.yaml").read_text()
    assert storage.store_many([footage(3, 2)]).completed == []  # a duplicate completes nothing again


def test_footage_cut_short_by_a_camera_outage_says_so(tmp_path: Path) -> None:
    """The camera went offline 2 s into a 10 s request and came back after it: the edge counts that time as
    recorded, so the dataset was complete with 5 frames of the 20 asked for and nothing saying why."""
    sessions, datasets, storage = footage_storage(tmp_path)
    jpeg = cv2.imencode(".jpg", np.zeros((48, 64, 3), np.uint8))[1].tobytes()
    seqs = itertools.count(1)  # the cloud stores a message once per (edge, seq)

    def record(name: str, times: list[float]) -> Dataset:
        with sessions.begin() as session:
            session.add(Dataset(name=name, source="footage", status="recording", edge_id=EDGE, camera=CAMERA,
                                request=f"{name}-1a2b", every=0.5, duration=10.0, max_frames=20, fps=2.0,
                                regions={}))  # fmt: skip

        def header(**fields: object) -> FootageHeader:
            return FootageHeader(edge=EDGE, run="r", seq=next(seqs), request=f"{name}-1a2b", camera=CAMERA, **fields)

        messages = [Message(EDGE, header(number=n, frame=n, timestamp=time), jpeg) for n, time in enumerate(times)]
        done = header(number=len(times), done=True, frames=len(times), payload="none")
        assert storage.store_many([*messages, Message(EDGE, done, b"")]).completed == [name]
        with sessions() as session:
            return datasets.get(session, name)

    cut = record("cut", [0.0, 0.5, 1.0, 1.5, 2.0])
    assert (cut.status, cut.frames) == ("complete", 5)
    assert cut.message == (
        "the camera sent no frames for 7.5 s of the 10 s asked for (it was offline?): 5 frame(s) recorded; request "
        "more footage for the rest"
    )
    whole = record("whole", [index * 0.5 for index in range(20)])
    assert (whole.status, whole.frames, whole.message) == ("complete", 20, "")
    gap = record("gap", [0.0, 0.5, 1.0, *(index * 0.5 for index in range(8, 20))])  # offline from 1.5 s to 4 s
    assert gap.message.startswith("the camera sent no frames for 2.5 s of the 10 s")


def test_footage_frames_that_cannot_be_the_datasets_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Frames past the number asked for and of another size went into the dataset's images (its archive shipped
    them to trainers; 4 frames of a request for 3, one 640x480 among 64x48)."""
    sessions, datasets, storage = footage_storage(tmp_path)
    with sessions.begin() as session:
        session.add(Dataset(name="few", source="footage", status="recording", edge_id=EDGE, camera=CAMERA,
                            request="few-1a2b", max_frames=3, fps=2.0, regions={}))  # fmt: skip
    small, large = (
        cv2.imencode(".jpg", np.zeros(shape, np.uint8))[1].tobytes() for shape in [(48, 64, 3), (480, 640, 3)]
    )
    sent = [(0, small), (1, large), (7, small), (2, small)]
    messages = [
        Message(
            EDGE,
            FootageHeader(
                edge=EDGE,
                run="r",
                seq=seq,
                request="few-1a2b",
                camera=CAMERA,
                number=number,
                frame=number,
                timestamp=number / 2,
            ),
            jpeg,
        )
        for seq, (number, jpeg) in enumerate(sent, start=1)
    ]
    assert storage.store_many(messages).outcomes == ["stored"] * 4  # acknowledged: an edge must not resend them
    with sessions() as session:
        row = datasets.get(session, "few")
        assert (row.frames, row.width, row.height) == (2, 64, 48)
    assert sorted(path.name for path in (tmp_path / "datasets" / "few" / "images").iterdir()) == [
        "000000.jpg",
        "000002.jpg",
    ]
    dropped = [record.getMessage() for record in caplog.records if "dropped" in record.getMessage()]
    assert sorted(dropped) == [
        "footage frame 1 for dataset few dropped: it is 640x480, not the 64x48 of the footage's frames",
        "footage frame 7 for dataset few dropped: it is number 7, past the 3 frames asked for",
    ]
