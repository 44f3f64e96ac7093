"""Datasets over REST (docs/studio.md), against a real `filterforward cloud serve` process (SQLite and PostgreSQL):
an uploaded clip becomes a labelled dataset folder the CLI's reader opens, labels and regions round-trip, and bad
input is refused with one line, leaving the dataset as it was."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
from cloud_server import READ_ONLY, CloudServer, run_cloud_on

from models.datasets import open_dataset, write_synthetic

FRAMES = 30


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cloud(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    with run_cloud_on(request.param, tmp_path_factory.mktemp(f"datasets-{request.param}")) as server:
        yield server


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clip")
    write_synthetic(folder, n_frames=FRAMES, size=(160, 96), fps=10.0)
    return folder / "video.mp4"


def upload(cloud: CloudServer, clip: Path, name: str, every: float = 0.0) -> dict:
    with cloud.client() as client, clip.open("rb") as video:
        answer = client.post(
            "/api/datasets/upload", data={"name": name, "every": str(every)}, files={"video": ("clip.mp4", video)}
        )
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_uploaded_clip_is_a_dataset_the_cli_reads(cloud: CloudServer, clip: Path) -> None:
    dataset = upload(cloud, clip, "walkway")
    assert (dataset["status"], dataset["frames"], dataset["width"], dataset["height"]) == ("complete", FRAMES, 160, 96)
    assert dataset["fps"] == pytest.approx(10.0)
    half = upload(cloud, clip, "walkway-half", every=0.2)  # one frame in two
    assert half["frames"] == FRAMES // 2 and half["fps"] == pytest.approx(5.0)

    labels = [{"frame": i, "value": 1 if 5 <= i < 10 or 20 <= i < 24 else 0} for i in range(FRAMES)]
    labels[12]["value"] = -1
    polygon = [[0.0, 0.5], [1.0, 0.5], [1.0, 1.0], [0.0, 1.0]]
    with cloud.client() as client:
        answer = client.put("/api/datasets/walkway/labels", json={"event": "person_near", "labels": labels})
        assert answer.status_code == 200, answer.text
        counts = answer.json()["events"]["person_near"]
        assert counts == {"labelled": 30, "positive": 9, "negative": 20, "uncertain": 1, "occurrences": 2}
        answer = client.put("/api/datasets/walkway/regions/person_near", json={"polygon": polygon})
        assert answer.status_code == 200, answer.text
        removed = client.put("/api/datasets/walkway/labels", json={"event": "person_near", "labels": [
            {"frame": 29, "value": None}]})  # fmt: skip
        assert removed.json()["events"]["person_near"]["labelled"] == 29
        frame = client.get("/api/datasets/walkway/frames/7.jpg")
        assert frame.status_code == 200 and frame.headers["content-type"] == "image/jpeg"
        assert cv2.imdecode(np.frombuffer(frame.content, np.uint8), 1).shape == (96, 160, 3)
        csv = client.get("/api/datasets/walkway/labels.csv")
        archive = client.get("/api/datasets/walkway/archive.tar")
        assert (
            client.get("/api/datasets/walkway/labels", params={"event": "person_near"}).json()["person_near"]["5"] == 1
        )

    assert csv.status_code == 200 and csv.text.splitlines()[0] == "frame_index,person_near,camera_frame"
    folder = cloud.config.data_dir / "datasets" / "walkway"
    read = open_dataset(folder)  # the CLI's reader, on the folder as the cloud keeps it
    assert read.n_frames == FRAMES and read.fps == pytest.approx(10.0)
    expected = np.array([lab["value"] for lab in labels], np.int8)
    expected[29] = -1  # removed: uncertain again
    np.testing.assert_array_equal(read.labels["person_near"], expected)
    assert read.roi("person_near").polygon == tuple(tuple(p) for p in polygon)

    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        names = tar.getnames()
        unpacked = Path(cloud.config.data_dir).parent / "unpacked"
        tar.extractall(unpacked, filter="data")
    assert {"labels.csv", "dataset.yaml", "images/000000.jpg", f"images/{FRAMES - 1:06d}.jpg"} <= set(names)
    np.testing.assert_array_equal(open_dataset(unpacked).labels["person_near"], expected)


def test_labels_saved_side_by_side_all_reach_labels_csv(cloud: CloudServer, clip: Path) -> None:
    """The studio saves labels in small batches, which may overlap: labels.csv (what trainers download) lagged
    behind the database when an older snapshot was written after a newer one."""
    upload(cloud, clip, "overlapping")

    def save(frame: int) -> int:
        with cloud.client() as client:
            body = {"event": "car", "labels": [{"frame": frame, "value": frame % 2}]}
            return client.put("/api/datasets/overlapping/labels", json=body).status_code

    for burst in range(3):
        frames = range(burst, FRAMES, 3)
        with ThreadPoolExecutor(len(frames)) as pool:
            assert set(pool.map(save, frames)) == {200}
        read = open_dataset(cloud.config.data_dir / "datasets" / "overlapping").labels["car"]
        expected = [frame % 2 if frame % 3 <= burst else -1 for frame in range(FRAMES)]
        assert read.tolist() == expected, f"burst {burst}"


def test_regions_saved_side_by_side_are_all_kept(cloud: CloudServer, clip: Path) -> None:
    """Each region save wrote back the regions it had read: of 16 saved at once, every one answered 200 and two in
    three were lost, in the database and in dataset.yaml (what trainers read)."""
    upload(cloud, clip, "regions-at-once")
    triangle = [[0.1, 0.1], [0.9, 0.1], [0.5, 0.9]]

    def save(event: str) -> int:
        with cloud.client() as client:
            return client.put(f"/api/datasets/regions-at-once/regions/{event}", json={"polygon": triangle}).status_code

    events = [f"event_{n}" for n in range(16)]
    with ThreadPoolExecutor(len(events)) as pool:
        assert set(pool.map(save, events)) == {200}
    with cloud.client() as client:
        assert sorted(client.get("/api/datasets/regions-at-once").json()["regions"]) == sorted(events)
    assert sorted(open_dataset(cloud.config.data_dir / "datasets" / "regions-at-once").regions) == sorted(events)


def test_changes_racing_a_deletion_get_404_not_500(cloud: CloudServer, clip: Path) -> None:
    """Label and region saves sent as the dataset was deleted failed in the database or its folder: 500s."""
    for attempt in range(3):
        upload(cloud, clip, "doomed-set")

        def change(n: int) -> int:
            with cloud.client() as client:
                if n == 0:
                    return client.delete("/api/datasets/doomed-set").status_code
                if n % 2:
                    body = {"event": f"ev{n}", "labels": [{"frame": n, "value": 1}]}
                    return client.put("/api/datasets/doomed-set/labels", json=body).status_code
                return client.put(f"/api/datasets/doomed-set/regions/ev{n}", json={"polygon": None}).status_code

        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(change, range(16)))
        assert statuses[0] == 204 and set(statuses[1:]) <= {200, 404}, (attempt, statuses)
        assert not (cloud.config.data_dir / "datasets" / "doomed-set").exists()


def test_clearing_a_region_leaves_no_event_behind(cloud: CloudServer, clip: Path) -> None:
    """A null region was kept as an event of its own: a typo in the path made a permanent empty event (and a
    labels.csv column) that nothing could remove."""
    upload(cloud, clip, "cleared")
    with cloud.client() as client:
        base = "/api/datasets/cleared/regions"
        assert client.put(f"{base}/never_seen", json={"polygon": None}).status_code == 200
        assert client.put(f"{base}/drawn", json={"polygon": [[0.1, 0.1], [0.9, 0.1], [0.5, 0.9]]}).status_code == 200
        assert sorted(client.get("/api/datasets/cleared").json()["events"]) == ["drawn"]
        assert client.put(f"{base}/drawn", json={"polygon": None}).status_code == 200
        answer = client.get("/api/datasets/cleared").json()
    assert (answer["events"], answer["regions"]) == ({}, {})
    folder = cloud.config.data_dir / "datasets" / "cleared"
    assert "drawn" not in (folder / "dataset.yaml").read_text() + (folder / "labels.csv").read_text()


def test_bad_input_is_refused_and_changes_nothing(cloud: CloudServer, clip: Path) -> None:
    upload(cloud, clip, "refusals")
    good = [{"frame": 3, "value": 1}]
    with cloud.client() as client:
        assert client.put("/api/datasets/refusals/labels", json={"event": "car", "labels": good}).status_code == 200
        before = client.get("/api/datasets/refusals").json()
        refusals = {
            "frame outside": (
                client.put,
                "/api/datasets/refusals/labels",
                {"event": "car", "labels": [{"frame": 2, "value": 0}, {"frame": FRAMES, "value": 1}]},
                404,
            ),
            "bad value": (
                client.put,
                "/api/datasets/refusals/labels",
                {"event": "car", "labels": [{"frame": 2, "value": 2}]},
                422,
            ),
            "true for a frame": (  # JSON's true was frame 1, false the value 0
                client.put,
                "/api/datasets/refusals/labels",
                {"event": "car", "labels": [{"frame": True, "value": False}]},
                422,
            ),
            "frame twice": (
                client.put,
                "/api/datasets/refusals/labels",
                {"event": "car", "labels": [{"frame": 2, "value": 1}, {"frame": 2, "value": 0}]},
                422,
            ),
            "reserved event": (
                client.put,
                "/api/datasets/refusals/labels",
                {"event": "camera_frame", "labels": good},
                422,
            ),
            "polygon outside": (
                client.put,
                "/api/datasets/refusals/regions/car",
                {"polygon": [[0, 0], [1.5, 0], [1, 1]]},
                422,
            ),
            "two points": (client.put, "/api/datasets/refusals/regions/car", {"polygon": [[0, 0], [1, 1]]}, 422),
            "bow tie": (
                client.put,
                "/api/datasets/refusals/regions/car",
                {"polygon": [[0, 0], [1, 1], [1, 0], [0, 1]]},
                422,
            ),
            "unknown dataset": (client.put, "/api/datasets/nothing/labels", {"event": "car", "labels": good}, 404),
            "unknown edge": (
                client.post,
                "/api/datasets/footage",
                {"name": "f", "edge": "nowhere", "camera": "c"},
                404,
            ),
        }
        for what, (method, path, body, code) in refusals.items():
            answer = method(path, json=body)
            assert answer.status_code == code, (what, answer.text)
            detail = answer.json()["detail"]
            assert isinstance(detail, str) and "\n" not in detail, (what, detail)
            if what == "frame twice":
                assert "frame 2 is given more than once: give each frame one value" in detail
            if what == "bow tie":
                assert "crosses itself: list its points in order around the region" in detail
        taken = client.post("/api/datasets/upload", data={"name": "refusals"}, files={"video": ("c.mp4", b"x")})
        assert taken.status_code == 409 and "exists" in taken.json()["detail"]
        garbage = client.post("/api/datasets/upload", data={"name": "garbage"}, files={"video": ("c.mp4", b"x" * 99)})
        assert garbage.status_code == 422 and "video" in garbage.json()["detail"]
        assert client.get("/api/datasets/garbage").status_code == 404
        # NaN is no number out of range but no number at all (it was told "less than or equal to 3600").
        video = {"video": ("c.mp4", b"x" * 99)}
        not_a_number = client.post("/api/datasets/upload", data={"name": "nan", "every": "nan"}, files=video)
        assert not_a_number.status_code == 422 and "every: Input should be a finite number" in not_a_number.text
        assert client.get("/api/datasets/refusals").json() == before
        frames = client.get("/api/datasets/refusals").json()["frames"]
        beyond = client.get("/api/datasets/refusals/frames/999.jpg")
        assert (beyond.status_code, beyond.json()["detail"]) == (
            404,
            f"frame 999 is not in dataset 'refusals': it has frames 0 to {frames - 1}",
        )
        nowhere = client.get("/api/datasets/nowhere/frames/0.jpg")
        assert (nowhere.status_code, nowhere.json()["detail"]) == (
            404,
            "no dataset 'nowhere': list them with GET /api/datasets",
        )
    with cloud.client(READ_ONLY) as viewer:
        assert viewer.put("/api/datasets/refusals/labels", json={"event": "car", "labels": good}).status_code == 403
        assert viewer.delete("/api/datasets/refusals").status_code == 403
        assert viewer.get("/api/datasets/refusals/archive.tar").status_code == 200
    with cloud.client() as client:
        assert client.delete("/api/datasets/refusals").status_code == 204
        assert client.get("/api/datasets/refusals").status_code == 404
    assert not (cloud.config.data_dir / "datasets" / "refusals").exists()
