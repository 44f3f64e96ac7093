"""Feedback on a filter made in the studio, over REST (docs/studio.md, "Feedback and revisions"), against a real
`filterforward cloud serve` process and real `filterforward trainer serve --once` processes: events marked wrong or
right and an interval the filter missed become labelled frames of its dataset (each stored frame once), a filter
registered by hand is refused, frames of another size than the dataset's (a cropped upload) are refused, a new
revision is trained on the feedback and proposes unlabelled frames to label next, and the filter rolls back to its
first revision."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from cloud_server import READ_ONLY, READ_WRITE, CloudServer, finish_trainer, job_model, run_cloud_on, start_trainer

from cloud.dataset_folders import DatasetFolders
from cloud.datasets import DatasetError, Datasets, SourceFrame, image_size
from cloud.db import Dataset, DatasetFrame, StoredFrame, make_engine, session_factory
from models.datasets import LabelledDataset, write_synthetic

TRAINER_TOKEN = "feedback-test-trainer-token-2468"
DATASET, EVENT, FILTER = "yard", "any_object", "yard-object"
UNLABELLED = range(70, 100)  # frames of the clip left without a label (the -1 frames of its truth are left too)
EDGE, RUN, CAMERA = "edge-1", "run-1", "cam-1"
WALL = 1.75e9  # the edge's clock at the first stored frame
EVENTS = {  # edge event id: (filter, first camera frame, the clip frames its stored frames show)
    "ev-wrong": (FILTER, 100, range(75, 79)),  # no object: a false alarm
    "ev-right": (FILTER, 200, range(40, 44)),  # the object
    "ev-other": (FILTER, 250, range(45, 47)),
    "ev-hand": ("by-hand", 300, range(0, 2)),
}
MISSED = (204, range(44, 48))  # camera frames 204.. another filter matched: the object, missed by FILTER
CROPPED = 540  # camera frames 540.. of ev-crop, some of them cropped (sent by the test that refuses them)
CHUNKED_FROM, CHUNKED = 600, 101  # camera frames 600..700 another filter matched: over cloud.feedback.CHUNK
TOKENS = [
    {"name": "operator", "token": READ_WRITE, "scopes": ["read", "write"]},
    {"name": "viewer", "token": READ_ONLY, "scopes": ["read"]},
    {"name": "trainer", "token": TRAINER_TOKEN, "scopes": ["train"]},
]


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> LabelledDataset:
    # seed 0: the object in frames 24-62 and 114-119 (two occurrences, so cross-validation runs)
    return write_synthetic(tmp_path_factory.mktemp("clip"), n_frames=120, size=(160, 96), seed=0)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cloud(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, clip: LabelledDataset, make_filter: Any
) -> Iterator[CloudServer]:
    """A cloud holding the clip as a dataset (partly labelled), the events and frames an edge sent, and a filter
    registered by hand."""
    root = tmp_path_factory.mktemp(f"cloud-{request.param}")
    with run_cloud_on(request.param, root, tokens=TOKENS, max_upload_bytes=2**20) as server:
        with server.client() as client, (clip.root / "video.mp4").open("rb") as video:
            answer = client.post("/api/datasets/upload", data={"name": DATASET}, files={"video": ("clip.mp4", video)})
            assert answer.status_code == 201, answer.text
            labels = [
                {"frame": i, "value": int(v)}
                for i, v in enumerate(clip.labels[EVENT])
                if v != -1 and i not in UNLABELLED
            ]
            answer = client.put(f"/api/datasets/{DATASET}/labels", json={"event": EVENT, "labels": labels})
            assert answer.status_code == 200, answer.text
            spec, onnx = make_filter("full_frame", "late", (160, 96), name="by-hand", event=EVENT)
            files = {"model": ("m.onnx", onnx)}
            answer = client.post("/api/filters", data={"spec": spec.model_dump_json()}, files=files)
            assert answer.status_code == 201, answer.text
        store_edge_messages(server, clip)
        yield server


def store_edge_messages(server: CloudServer, clip: LabelledDataset) -> None:
    """What an edge would have sent, stored as the ingest stores it: the events with their frames (JPEGs of the
    clip's frames), and frames another filter matched, among them the frames of ev-right again (without an image:
    they share the one sent first)."""
    from common.protocol import Hello

    images = {index: jpeg(image) for index, image in clip.frames()}
    with edge_messages(server, seq=0) as edge:
        edge.storage.edge_hello(EDGE, Hello(edge=EDGE, run=RUN, cameras=[CAMERA]), None)
        for event_id, (filter_name, first, shows) in EVENTS.items():
            edge.event(event_id, filter_name, first)
            for offset, image in enumerate(shows):
                edge.frame(first + offset, {filter_name: 0.9}, [event_id], images[image])
        for index in range(EVENTS["ev-right"][1], MISSED[0]):
            edge.frame(index, {"other": 0.8}, [], None)
        for offset, image in enumerate(MISSED[1]):
            edge.frame(MISSED[0] + offset, {"other": 0.8}, [], images[image])


class EdgeMessages:
    """Messages of the edge stored through cloud.storage.Storage (the ingest's storage), numbered on from `seq`."""

    def __init__(self, storage: Any, seq: int) -> None:
        self.storage = storage
        self.seq = seq

    def event(self, event_id: str, filter_name: str, first: int) -> None:
        from common.protocol import EventHeader, EventInfo

        self.seq += 1
        info = EventInfo(
            id=event_id, filter=filter_name, camera=CAMERA, start_frame=first, start_time=first / 15, peak_score=0.9
        )
        header = EventHeader(edge=EDGE, run=RUN, seq=self.seq, phase="start", wall_time=wall(first), event=info)
        self.storage.store_event(EDGE, header, b"")

    def frame(self, index: int, scores: dict[str, float], events: list[str], image: bytes | None) -> None:
        from common.protocol import FrameHeader

        self.seq += 1
        header = FrameHeader(
            edge=EDGE, run=RUN, seq=self.seq, camera=CAMERA, frame=index, timestamp=index / 15, wall_time=wall(index),
            scores=scores, events=events, payload="none" if image is None else "jpeg",
        )  # fmt: skip
        self.storage.store_frame(EDGE, header, b"" if image is None else image)


@contextmanager
def edge_messages(server: CloudServer, seq: int) -> Iterator[EdgeMessages]:
    from cloud.db import make_engine, session_factory
    from cloud.framestore import FrameStore
    from cloud.storage import Storage

    engine = make_engine(server.config.db_url)
    try:
        yield EdgeMessages(Storage(session_factory(engine), FrameStore(server.config.data_dir / "frames")), seq)
    finally:
        engine.dispose()


def jpeg(image: np.ndarray) -> bytes:
    return cv2.imencode(".jpg", image)[1].tobytes()


def wall(camera_frame: int) -> float:
    """The edge's clock when it processed a camera frame (15 fps from WALL at frame 100)."""
    return WALL + (camera_frame - 100) / 15


def iso(camera_frame: int) -> str:
    return datetime.fromtimestamp(wall(camera_frame), UTC).isoformat()


def rest(cloud: CloudServer, method: str, path: str, **kwargs: Any) -> Any:
    with cloud.client() as client:
        return client.request(method, path, **kwargs)


def event_id(cloud: CloudServer, edge_event: str) -> int:
    items = rest(cloud, "GET", "/api/events", params={"limit": 500}).json()["items"]
    return next(item["id"] for item in items if item["uid"] == f"{EDGE}/{RUN}/{edge_event}")


def frame_ids(cloud: CloudServer, event: int) -> list[int]:
    return [frame["id"] for frame in rest(cloud, "GET", f"/api/events/{event}/frames").json()]


def labels(cloud: CloudServer) -> dict[int, int]:
    stored = rest(cloud, "GET", f"/api/datasets/{DATASET}/labels", params={"event": EVENT}).json()
    return {int(frame): value for frame, value in stored.get(EVENT, {}).items()}


def train(cloud: CloudServer, base_model: Path, work: Path, name: str) -> dict[str, Any]:
    """Queue a job for FILTER on the dataset, run a trainer on it, deploy it; the done job."""
    body = {"dataset": DATASET, "event": EVENT, "filter": FILTER, "options": {"steps": 30}}
    job = rest(cloud, "POST", "/api/training-jobs", json=body)
    assert job.status_code == 201, job.text
    finish_trainer(start_trainer(cloud, TRAINER_TOKEN, base_model, work, name), work, name)
    deployed = rest(cloud, "POST", f"/api/training-jobs/{job.json()['id']}/deploy")
    assert deployed.status_code == 200, deployed.text
    done = rest(cloud, "GET", f"/api/training-jobs/{job.json()['id']}").json()
    assert done["status"] == "done" and done["deployed"], done
    return done


@pytest.fixture(scope="module")
def first_job(cloud: CloudServer, base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return train(cloud, base_model, tmp_path_factory.mktemp("trainer"), "trainer-1")


def test_the_first_revision_proposes_unlabelled_frames_to_label_next(
    cloud: CloudServer, clip: LabelledDataset, first_job: dict[str, Any]
) -> None:
    uncertain = first_job["result"]["uncertain"]
    labelled = labels(cloud)
    threshold = first_job["spec"]["smoothing"]["threshold"]
    assert 0 < len(uncertain) <= 20
    frames = [example["frame"] for example in uncertain]
    assert len(set(frames)) == len(frames) and all(0 <= f < clip.n_frames and f not in labelled for f in frames)
    distances = [abs(example["score"] - threshold) for example in uncertain]
    assert distances == sorted(distances)  # the least sure first


def test_events_marked_wrong_or_right_and_a_missed_interval_become_labelled_frames_once(
    cloud: CloudServer, clip: LabelledDataset, first_job: dict[str, Any]
) -> None:
    before = rest(cloud, "GET", f"/api/datasets/{DATASET}").json()
    old, first = before["events"][EVENT], before["frames"]
    wrong = event_id(cloud, "ev-wrong")
    answer = rest(cloud, "POST", f"/api/events/{wrong}/feedback", json={"value": 0})
    assert answer.status_code == 200, answer.text
    given = answer.json()
    assert (given["event"], given["added"], given["labelled"]) == (EVENT, 4, 4)
    dataset = given["dataset"]
    assert (dataset["name"], dataset["frames"]) == (DATASET, first + 4)
    counts = dataset["events"][EVENT]
    assert (counts["labelled"], counts["negative"]) == (old["labelled"] + 4, old["negative"] + 4)
    assert {frame: labels(cloud)[frame] for frame in range(first, first + 4)} == dict.fromkeys(
        range(first, first + 4), 0
    )
    again = rest(cloud, "POST", f"/api/events/{wrong}/feedback", json={"value": 0})  # the same frames: not added again
    assert (again.json()["added"], again.json()["labelled"], again.json()["dataset"]) == (0, 4, dataset)

    # The images are the frames the edge sent, in stream order, and labels.csv lists them with their camera frames.
    sent = [rest(cloud, "GET", f"/api/frames/{frame}.jpg").content for frame in frame_ids(cloud, wrong)]
    assert dataset_images(cloud, range(first, first + 4)) == sent
    csv = rest(cloud, "GET", f"/api/datasets/{DATASET}/labels.csv").text.splitlines()
    assert csv[-4:] == [f"{first + i},0,{100 + i}" for i in range(4)]  # frame_index, the label, camera_frame

    # Right, from two of its frames; then all of them: the two are not added again.
    right = event_id(cloud, "ev-right")
    two = frame_ids(cloud, right)[:2]
    answer = rest(cloud, "POST", f"/api/events/{right}/feedback", json={"value": 1, "frames": two})
    assert (answer.json()["added"], answer.json()["labelled"]) == (2, 2)
    answer = rest(cloud, "POST", f"/api/events/{right}/feedback", json={"value": 1})
    assert (answer.json()["added"], answer.json()["labelled"], answer.json()["dataset"]["frames"]) == (2, 4, first + 8)
    assert answer.json()["dataset"]["events"][EVENT]["positive"] == old["positive"] + 4

    # Marked the other way: the same frames, relabelled; and back.
    answer = rest(cloud, "POST", f"/api/events/{wrong}/feedback", json={"value": 1})
    assert (answer.json()["added"], answer.json()["dataset"]["events"][EVENT]["positive"]) == (0, old["positive"] + 8)
    answer = rest(cloud, "POST", f"/api/events/{wrong}/feedback", json={"value": 0})
    assert answer.json()["dataset"]["events"][EVENT]["negative"] == old["negative"] + 4

    # Missed: camera frames 200..207, whichever filter sent them. 200-203 are ev-right's (in the dataset already,
    # stored twice: another filter matched them too), 204-207 only another filter's.
    body = {"edge": EDGE, "camera": CAMERA, "start": iso(200), "end": iso(208)}
    answer = rest(cloud, "POST", f"/api/filters/{FILTER}/missed", json=body)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["added"], answer.json()["labelled"], answer.json()["dataset"]["frames"]) == (4, 8, first + 12)
    assert answer.json()["dataset"]["events"][EVENT]["positive"] == old["positive"] + 8
    assert dataset_images(cloud, range(first + 8, first + 12)) == [jpeg(image) for _, image in clip.frames(44, 48)]
    assert all(labels(cloud)[frame] == 1 for frame in range(first + 4, first + 12))

    # An interval the cloud holds no frame of: request footage of the camera instead.
    for camera, start, end in [(CAMERA, 400, 500), ("cam-2", 200, 208)]:
        body = {"edge": EDGE, "camera": camera, "start": iso(start), "end": iso(end)}
        refused = rest(cloud, "POST", f"/api/filters/{FILTER}/missed", json=body)
        assert refused.status_code == 409 and "request footage of that camera" in refused.json()["detail"], body
    assert rest(cloud, "GET", f"/api/datasets/{DATASET}").json()["frames"] == first + 12


def dataset_images(cloud: CloudServer, frames: range) -> list[bytes]:
    return [rest(cloud, "GET", f"/api/datasets/{DATASET}/frames/{frame}.jpg").content for frame in frames]


def test_feedback_that_cannot_be_taken_is_refused_in_one_line(cloud: CloudServer, first_job: dict[str, Any]) -> None:
    before = rest(cloud, "GET", f"/api/datasets/{DATASET}").json()
    right, other, hand = (event_id(cloud, name) for name in ("ev-right", "ev-other", "ev-hand"))
    cases = [
        (f"/api/events/{right}/feedback", {"value": 0, "frames": frame_ids(cloud, other)[:1]}, 422,
         f"is not one of event {right}'s frames"),
        (f"/api/events/{right}/feedback", {"value": 0, "frames": [2**40]}, 422, "is not one of event"),
        (f"/api/events/{hand}/feedback", {"value": 0}, 409, "'by-hand' was not made in the studio"),
        ("/api/events/999999/feedback", {"value": 0}, 404, "no event 999999"),
        (f"/api/events/{right}/feedback", {"value": 2}, 422, "body.value"),
        (f"/api/events/{right}/feedback", {"value": True}, 422, "body.value: Input should be a number, not true"),
        (f"/api/events/{right}/feedback", {"value": 0, "extra": 1}, 422, "body.extra"),
        ("/api/filters/by-hand/missed", {"edge": EDGE, "camera": CAMERA, "start": iso(300), "end": iso(310)}, 409,
         "train it in the studio first"),
        (f"/api/filters/{FILTER}/missed", {"edge": EDGE, "camera": CAMERA, "start": iso(210), "end": iso(200)}, 422,
         "is not before end"),
        (f"/api/filters/{FILTER}/missed", {"edge": EDGE, "camera": CAMERA, "start": 1.7e9, "end": iso(200)}, 422,
         "use an ISO 8601 time"),
    ]  # fmt: skip
    with cloud.client(READ_ONLY) as client:
        assert client.post(f"/api/events/{right}/feedback", json={"value": 0}).status_code == 403
    for path, body, status, detail in cases:
        answer = rest(cloud, "POST", path, json=body)
        assert answer.status_code == status, (body, answer.text)
        assert detail in answer.json()["detail"] and "\n" not in answer.json()["detail"], (body, answer.text)
    assert rest(cloud, "GET", f"/api/datasets/{DATASET}").json() == before


def test_frames_of_another_size_than_the_datasets_are_refused(
    cloud: CloudServer, clip: LabelledDataset, first_job: dict[str, Any]
) -> None:
    """An edge uploading only its region of interest (`upload: {crop: roi}`) sends smaller JPEGs: an image folder of
    mixed sizes cannot be trained on, so feedback with them is refused, and nothing of the request is added."""
    images = [jpeg(image) for _, image in clip.frames(40, 44)]
    roi = [jpeg(image[24:72, 40:120]) for _, image in clip.frames(44, 46)]  # 80x48 of the 160x96 frames
    with edge_messages(cloud, seq=10_000) as edge:
        edge.event("ev-crop", FILTER, CROPPED)  # two whole frames, then two of the region of interest only
        for offset, image in enumerate(images[:2] + roi):
            edge.frame(CROPPED + offset, {FILTER: 0.9}, ["ev-crop"], image)
        for offset in range(CHUNKED - 1):  # more frames than feedback adds at a time, the last one cropped
            edge.frame(CHUNKED_FROM + offset, {"other": 0.8}, [], images[offset % len(images)])
        edge.frame(CHUNKED_FROM + CHUNKED - 1, {"other": 0.8}, [], roi[0])
    before, labelled = rest(cloud, "GET", f"/api/datasets/{DATASET}").json(), labels(cloud)
    assert (before["width"], before["height"]) == (160, 96)
    cropped = event_id(cloud, "ev-crop")
    why = (
        "are 80x48, not the dataset's 160x96 frames (a camera of another size, or an edge that uploads them cropped or "
        "scaled: its upload crop or scale): label footage of that camera instead"
    )
    cases = [
        (f"/api/events/{cropped}/feedback", {"value": 1}, f"frames of event {cropped} {why}"),
        (f"/api/events/{cropped}/feedback", {"value": 1, "frames": frame_ids(cloud, cropped)[1:3]},
         f"frames of event {cropped} {why}"),
        (f"/api/filters/{FILTER}/missed",
         {"edge": EDGE, "camera": CAMERA, "start": iso(CHUNKED_FROM), "end": iso(CHUNKED_FROM + CHUNKED)},
         f"frames of camera {CAMERA!r} in that interval {why}"),
    ]  # fmt: skip
    for path, body, detail in cases:
        answer = rest(cloud, "POST", path, json=body)
        assert (answer.status_code, answer.json()["detail"]) == (422, detail), body
    assert rest(cloud, "GET", f"/api/datasets/{DATASET}").json() == before
    assert labels(cloud) == labelled

    # The event's whole frames alone are taken.
    whole = frame_ids(cloud, cropped)[:2]
    answer = rest(cloud, "POST", f"/api/events/{cropped}/feedback", json={"value": 1, "frames": whole})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["added"], answer.json()["dataset"]["frames"]) == (2, before["frames"] + 2)


def test_a_new_revision_is_trained_on_the_feedback_and_the_first_one_rolled_back_to(
    cloud: CloudServer, first_job: dict[str, Any], base_model: Path, tmp_path: Path
) -> None:
    answer = rest(cloud, "POST", f"/api/events/{event_id(cloud, 'ev-wrong')}/feedback", json={"value": 0})
    assert answer.status_code == 200, answer.text  # (given before by the test above, when it ran)
    dataset = answer.json()["dataset"]
    second = train(cloud, base_model, tmp_path, "trainer-2")
    report, counts = second["result"], dataset["events"][EVENT]
    assert (report["positives"], report["negatives"]) == (counts["positive"], counts["negative"])
    assert report["negatives"] > first_job["result"]["negatives"]
    labelled = labels(cloud)
    assert report["uncertain"]
    assert all(e["frame"] < dataset["frames"] and e["frame"] not in labelled for e in report["uncertain"])

    revisions = rest(cloud, "GET", f"/api/filters/{FILTER}/revisions").json()
    assert [(r["job"], r["current"]) for r in revisions] == [(second["id"], True), (first_job["id"], False)]
    assert revisions[0]["validation"] == second["spec"]["validation"]
    assert (revisions[1]["positives"], revisions[1]["dataset"]) == (first_job["result"]["positives"], DATASET)

    # The operator widens the filter to another camera; rolling back keeps that and puts the first model back.
    spec = rest(cloud, "GET", f"/api/filters/{FILTER}").json()["spec"]
    widened = json.dumps({**spec, "cameras": [CAMERA, "cam-9"]})
    assert rest(cloud, "PUT", f"/api/filters/{FILTER}", data={"spec": widened}).status_code == 200
    rolled = rest(cloud, "POST", f"/api/training-jobs/{first_job['id']}/deploy")
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["spec"]["cameras"] == [CAMERA, "cam-9"]
    assert rolled.json()["spec"]["validation"] == first_job["spec"]["validation"]
    assert rest(cloud, "GET", f"/api/filters/{FILTER}/model").content == job_model(cloud, first_job["id"])
    revisions = rest(cloud, "GET", f"/api/filters/{FILTER}/revisions").json()
    assert [(r["job"], r["current"]) for r in revisions] == [(second["id"], False), (first_job["id"], True)]

    # A filter registered by hand has no revisions; an unknown one is not found.
    assert rest(cloud, "GET", "/api/filters/by-hand/revisions").json() == []
    assert rest(cloud, "GET", "/api/filters/nowhere/revisions").status_code == 404
    assert "Traceback" not in cloud.log_text(), cloud.log_text()[-4000:]


def test_frames_decoded_from_an_odd_sized_cameras_stream_join_at_the_cameras_size(tmp_path: Path) -> None:
    """The edge's H.264 stream grows a camera's odd sides by one repeated pixel (common.video.even); a frame decoded
    from it joins the dataset cut back to the camera's own size, not refused as another size."""
    sessions = session_factory(make_engine(f"sqlite:///{tmp_path / 'cloud.db'}"))
    datasets = Datasets(sessions, DatasetFolders(tmp_path / "datasets"))
    with sessions.begin() as session:
        session.add(Dataset(name="odd", source="upload", status="complete", width=161, height=97, regions={}))
        session.add(StoredFrame(id=7, edge_id="e", seq=1, run="r", camera="c", frame_index=70, stream_time=7.0,
                                captured_at=datetime.now(UTC), scores={}))  # fmt: skip
    coarse = np.random.default_rng(0).integers(0, 255, (7, 11, 3), np.uint8)
    image = cv2.resize(coarse, (162, 98), interpolation=cv2.INTER_LINEAR)  # smooth: JPEG keeps it close
    jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 100])[1].tobytes()
    assert image_size(jpeg) == (162, 98)
    assert datasets.append("odd", "car", 1, [SourceFrame(7, "e", "r", "c", 70, 7.0, jpeg)], "frames of event 1") == 1
    stored = cv2.imread(str(datasets.folders.image("odd", 0)))
    assert stored.shape == (97, 161, 3)
    assert np.abs(stored.astype(int) - image[:97, :161].astype(int)).mean() < 3  # the top-left part, re-encoded


def test_feedback_on_a_frame_the_footage_holds_relabels_it_rather_than_copying_it(tmp_path: Path) -> None:
    """A filter trained on a camera's footage matches frames of that footage's time too: marked (or missed), such a
    frame was added again, the same picture in the dataset twice with opposite labels."""
    sessions = session_factory(make_engine(f"sqlite:///{tmp_path / 'cloud.db'}"))
    datasets = Datasets(sessions, DatasetFolders(tmp_path / "datasets"))
    jpeg = cv2.imencode(".jpg", np.full((48, 64, 3), 90, np.uint8))[1].tobytes()
    with sessions.begin() as session:
        session.add(Dataset(name="foot", source="footage", status="complete", edge_id="e", camera="c", width=64,
                            height=48, frames=3, regions={}))  # fmt: skip
        session.add_all(
            DatasetFrame(dataset="foot", number=number, camera_frame=70 + number, timestamp=number, run="r")
            for number in range(3)
        )
        for frame_id, run in ((7, "r"), (8, "r2")):  # the footage's run, and a later one (its indices start over)
            session.add(StoredFrame(id=frame_id, edge_id="e", seq=frame_id, run=run, camera="c", frame_index=71,
                                    stream_time=7.1, captured_at=datetime.now(UTC), scores={}))  # fmt: skip
    datasets.set_labels("foot", "car", [(0, 0), (1, 0), (2, 0)])
    same = SourceFrame(7, "e", "r", "c", 71, 7.1, jpeg)
    assert datasets.append("foot", "car", 1, [same], "frames of event 1") == 0  # footage frame 1: relabelled
    later = SourceFrame(8, "e", "r2", "c", 71, 7.1, jpeg)
    assert datasets.append("foot", "car", 1, [later], "frames of event 2") == 1  # another camera frame: added
    with sessions() as session:
        assert datasets.labels(session, "foot")["car"] == {0: 0, 1: 1, 2: 0, 3: 1}
        assert datasets.frame_count(session, "foot") == 4


def test_feedback_frames_are_taken_in_stream_order_whatever_their_wall_times(tmp_path: Path) -> None:
    """Edges before 2026-12-08 stamped a back-dated frame (a k-of-n event's first frames) with the time it was sent,
    after frames processed later: ordered by that time, camera frames 316, 315, 317 became dataset frames in that
    order. Now a run's frames go by index, the runs (the edge's starts) oldest first."""
    from cloud.feedback import _camera_frames

    sessions = session_factory(make_engine(f"sqlite:///{tmp_path / 'cloud.db'}"))
    start = datetime(2026, 12, 8, tzinfo=UTC)
    stored = [  # (id, run, camera frame, seconds after start, an image stored)
        (1, "later", 317, 20.0, True),
        (2, "later", 315, 20.3, True),  # back-dated: sent after 317
        (3, "later", 316, 20.3, True),
        (4, "earlier", 900, 1.0, True),  # the run before: its indices are higher
        (5, "later", 316, 20.1, False),  # frame 316 again, another filter's match without an image
    ]
    with sessions.begin() as session:
        for frame_id, run, index, seconds, image in stored:
            session.add(StoredFrame(id=frame_id, edge_id="e", seq=frame_id, run=run, camera="c", frame_index=index,
                                    stream_time=index / 15, captured_at=start + timedelta(seconds=seconds),
                                    scores={}, path=f"{frame_id}.jpg" if image else None))  # fmt: skip
    with sessions() as session:
        assert _camera_frames(session, StoredFrame.camera == "c", limit=None) == [4, 2, 3, 1]
        assert _camera_frames(session, StoredFrame.camera == "c", limit=2) == [4, 2]


def test_feedback_from_another_camera_than_a_footage_datasets_is_refused_naming_both(tmp_path: Path) -> None:
    """A studio filter running on every camera fires on one of another size: its frames were refused as "a cropped
    or scaled upload", which they were not."""
    sessions = session_factory(make_engine(f"sqlite:///{tmp_path / 'cloud.db'}"))
    datasets = Datasets(sessions, DatasetFolders(tmp_path / "datasets"))
    with sessions.begin() as session:
        session.add(Dataset(name="yard", source="footage", status="complete", edge_id="e", camera="yard", width=64,
                            height=48, frames=0, regions={}))  # fmt: skip
    campus = SourceFrame(7, "e", "r", "campus", 70, 7.0, jpeg(np.zeros((24, 32, 3), np.uint8)))
    with pytest.raises(DatasetError) as refused:
        datasets.append("yard", "car", 1, [campus], "frames of event 3")
    assert refused.value.status == 422
    assert str(refused.value) == (
        "frames of event 3 are from camera 'campus' (32x24); dataset 'yard' holds the 64x48 frames of camera 'yard': "
        "give feedback on that camera's events only, or record footage of 'campus' into a dataset of its own"
    )
