"""Feedback and revisions in the web page (docs/studio.md, "Feedback and revisions"), in real headless Chromium against
a real `filterforward cloud serve` process: an event marked wrong from the gallery and an interval marked missed
become labelled frames of the filter's dataset; the studio proposes the frames to label next, trains a new revision,
shows the two estimates side by side, and rolls the filter back from its revisions list. Each training job is
finished by this test over the trainers' REST calls (claim, result), with a made-up estimate: the real trainer is
tested in test_feedback.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cv2
import pytest
from cloud_server import READ_WRITE, CloudServer, run_cloud
from support import signed_in

from models.datasets import LabelledDataset, write_synthetic

playwright_api = pytest.importorskip("playwright.sync_api")
Page = playwright_api.Page
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")
expect.set_options(timeout=15_000)  # the page polls every 2 s

TRAINER_TOKEN = "feedback-page-trainer-token-1357"
SIZE = (160, 96)
DATASET, EVENT, FILTER = "porch", "any_object", "porch-object"
UNLABELLED = range(70, 100)  # frames left without a label: the ones a filter proposes to label next
EDGE, RUN, CAMERA = "edge-1", "run-1", "cam-1"
WALL = 1.75e9  # the edge's clock at camera frame 0 (15 fps)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> LabelledDataset:
    return write_synthetic(tmp_path_factory.mktemp("clip"), n_frames=120, size=SIZE, seed=0)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory, clip: LabelledDataset) -> Iterator[CloudServer]:
    """A cloud with the clip as a partly labelled dataset, an event an edge sent with four frames, and four frames of
    the same camera another filter matched."""
    tokens = [
        {"name": "operator", "token": READ_WRITE, "scopes": ["read", "write"]},
        {"name": "trainer", "token": TRAINER_TOKEN, "scopes": ["train"]},
    ]
    with run_cloud(tmp_path_factory.mktemp("cloud"), tokens=tokens, max_upload_bytes=2**20) as server:
        with server.client() as client, (clip.root / "video.mp4").open("rb") as video:
            answer = client.post("/api/datasets/upload", data={"name": DATASET}, files={"video": ("clip.mp4", video)})
            assert answer.status_code == 201, answer.text
            truth = enumerate(clip.labels[EVENT])
            given = [{"frame": i, "value": int(v)} for i, v in truth if v != -1 and i not in UNLABELLED]
            answer = client.put(f"/api/datasets/{DATASET}/labels", json={"event": EVENT, "labels": given})
            assert answer.status_code == 200, answer.text
        store_frames(server, clip)
        yield server


def store_frames(server: CloudServer, clip: LabelledDataset) -> None:
    from cloud.db import make_engine, session_factory
    from cloud.framestore import FrameStore
    from cloud.storage import Storage
    from common.protocol import EventHeader, EventInfo, FrameHeader, Hello

    engine = make_engine(server.config.db_url)
    storage = Storage(session_factory(engine), FrameStore(server.config.data_dir / "frames"))
    storage.edge_hello(EDGE, Hello(edge=EDGE, run=RUN, cameras=[CAMERA]), None)
    info = EventInfo(id="ev-1", filter=FILTER, camera=CAMERA, start_frame=100, start_time=100 / 15, peak_score=0.9)
    storage.store_event(EDGE, EventHeader(edge=EDGE, run=RUN, seq=1, phase="start", wall_time=wall(100), event=info),
                        b"")  # fmt: skip
    shown = [(100 + i, FILTER, ["ev-1"], 75 + i) for i in range(4)]  # no object: a false alarm
    shown += [(400 + i, "other", [], 40 + i) for i in range(4)]  # the object, missed by FILTER
    for seq, (index, filter_name, events, image) in enumerate(shown, start=2):
        header = FrameHeader(
            edge=EDGE, run=RUN, seq=seq, camera=CAMERA, frame=index, timestamp=index / 15, wall_time=wall(index),
            scores={filter_name: 0.9}, events=events,
        )  # fmt: skip
        storage.store_frame(EDGE, header, cv2.imencode(".jpg", next(clip.frames(image, image + 1))[1])[1].tobytes())
    engine.dispose()


def wall(camera_frame: int) -> float:
    return WALL + camera_frame / 15


def local(seconds: float) -> str:
    """A datetime-local value (the page's browser runs in UTC)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def rest(cloud: CloudServer, method: str, path: str, **kwargs: Any) -> Any:
    with cloud.client() as client:
        return client.request(method, path, **kwargs)


def finish_job(cloud: CloudServer, make_filter: Any, f1: float, bias: float | None) -> tuple[int, bytes]:
    """What a trainer does with the next job, over its REST calls: a bundle (an MC with random weights, or a
    constant one) with a made-up estimate, proposing unlabelled frames to label next; the job's id and model."""
    counts = rest(cloud, "GET", f"/api/datasets/{DATASET}").json()["events"][EVENT]
    validation = {"event_f1": f1, "f1_min": f1 - 0.1, "f1_max": f1 + 0.1, "precision": f1, "event_recall": f1,
                  "folds": 2, "occurrences": 2, "method": "occurrences"}  # fmt: skip
    spec, onnx = make_filter("full_frame", "late", SIZE, name=FILTER, event=EVENT, bias=bias, validation=validation)
    report = {
        "filter": FILTER, "event": EVENT, "architecture": "full_frame", "tap": "late", "input_size": list(SIZE),
        "frames": [0, 120], "positives": counts["positive"], "negatives": counts["negative"], "steps": 30,
        "validation": validation, "training_f1": 0.9, "warnings": [], "candidates": [],
        "examples": {"source": "cross-validation", "hits": [], "false_alarms": [], "misses": [],
                     "counts": {"hits": 0, "false_alarms": 0, "misses": 0}},
        "uncertain": [{"frame": frame, "score": 0.5} for frame in (80, 81, 30)], "seconds": 1.0,
    }  # fmt: skip
    with cloud.client(TRAINER_TOKEN) as client:
        job = client.post("/api/training-jobs/claim", json={"trainer": "test"}).json()
        form = {"trainer": "test", "spec": spec.model_dump_json(), "report": json.dumps(report)}
        answer = client.post(f"/api/training-jobs/{job['id']}/result", data=form, files={"model": ("m.onnx", onnx)})
    assert answer.status_code == 200, answer.text
    return job["id"], onnx


@pytest.fixture
def page(browser, cloud: CloudServer) -> Iterator[Page]:
    viewport = {"width": 1400, "height": 1000}
    with signed_in(browser, cloud.url, READ_WRITE, viewport=viewport, timezone_id="UTC") as page:
        yield page


def test_feedback_from_the_gallery_a_new_revision_and_a_rollback(
    page: Page, cloud: CloudServer, make_filter: Any
) -> None:
    body = {"dataset": DATASET, "event": EVENT, "filter": FILTER, "options": {"steps": 30}}
    assert rest(cloud, "POST", "/api/training-jobs", json=body).status_code == 201
    first, first_model = finish_job(cloud, make_filter, 0.6, bias=None)
    assert rest(cloud, "POST", f"/api/training-jobs/{first}/deploy").status_code == 200
    before = rest(cloud, "GET", f"/api/datasets/{DATASET}").json()

    # The event was a false alarm: "Wrong" on its card.
    card = page.get_by_test_id("event-card")
    expect(card).to_have_count(1)
    card.get_by_test_id("event-wrong").click()
    message = card.get_by_test_id("event-feedback-message")
    expect(message).to_have_text(f"4 frames labelled without {EVENT} in dataset {DATASET} (4 new).")
    after = rest(cloud, "GET", f"/api/datasets/{DATASET}").json()
    assert after["frames"] == before["frames"] + 4
    assert after["events"][EVENT]["negative"] == before["events"][EVENT]["negative"] + 4

    # A filter not made in the studio has no dataset: the refusal says what to do.
    page.get_by_text("Mark an interval a filter missed").click()
    form = page.get_by_test_id("missed-form")
    expect(form.get_by_label("On camera").locator("option")).to_have_text([f"{CAMERA} ({EDGE})"])
    form.get_by_label("Filter that missed it").fill("by-hand")
    form.get_by_label("From").fill(local(wall(390)))
    form.get_by_label("Until").fill(local(wall(410)))
    form.get_by_test_id("missed-submit").click()
    expect(page.get_by_test_id("missed-message")).to_contain_text(
        "Not added: filter 'by-hand' was not made in the studio"
    )
    # The other filter's four frames of the object: FILTER missed them.
    form.get_by_label("Filter that missed it").fill(FILTER)
    form.get_by_test_id("missed-submit").click()
    expect(page.get_by_test_id("missed-message")).to_have_text(
        f"4 frames labelled with {EVENT} in dataset {DATASET} (4 new)."
    )
    after = rest(cloud, "GET", f"/api/datasets/{DATASET}").json()
    assert (after["frames"], after["events"][EVENT]["positive"]) == (
        before["frames"] + 8, before["events"][EVENT]["positive"] + 4
    )  # fmt: skip

    # The studio: the first revision's frames to label next (80, 81: 30 is labelled already), one opened.
    page.locator(f'[data-testid="dataset-row"][data-name="{DATASET}"]').get_by_test_id("dataset-label").click()
    page.get_by_test_id("studio-event").fill(EVENT)
    page.get_by_test_id("studio-event").press("Enter")
    improve = page.get_by_test_id("improve")
    proposed = improve.get_by_test_id("uncertain-frames").locator("button.example")
    expect(proposed).to_have_count(2)
    assert [button.get_attribute("data-frame") for button in proposed.all()] == ["80", "81"]
    proposed.last.click()
    expect(page.get_by_test_id("stage")).to_have_attribute("data-frame", "81")
    page.keyboard.press("1")  # labelled: it is no longer proposed once the job is shown again
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    revisions = page.get_by_test_id("revision")
    expect(revisions).to_have_count(1)
    expect(revisions.first.get_by_test_id("revision-current")).to_have_text("current")

    # A new revision: queued from the page, finished by a trainer; the two estimates side by side.
    improve.get_by_test_id("train-revision").click()
    expect(page.get_by_test_id("train-message")).to_contain_text(f"a new revision of {FILTER}")
    expect(page.get_by_test_id("job-status")).to_have_text("queued")
    second, _ = finish_job(cloud, make_filter, 0.8, bias=-10.0)
    expect(page.get_by_test_id("job-status")).to_have_text("done")
    compare = page.get_by_test_id("compare")
    expect(compare.locator("thead th")).to_have_text([f"Job {first}", f"Job {second}"])
    expect(compare.locator('[data-field="f1"] td')).to_have_text(["0.60 (0.50–0.70)", "0.80 (0.70–0.90)"])
    job = rest(cloud, "GET", f"/api/training-jobs/{second}").json()
    assert job["result"]["positives"] == after["events"][EVENT]["positive"] + 1  # frame 81, labelled above
    expect(compare.locator('[data-field="frames"] td').last).to_have_text(
        f"{job['result']['positives']} event / {job['result']['negatives']} not"
    )
    expect(page.get_by_test_id("uncertain-frames").locator("button.example")).to_have_count(1)  # 80: 81 is labelled

    # Deployed, it is the current revision; rolling back puts the first model back.
    page.get_by_test_id("job-deploy").click()
    expect(page.get_by_test_id("deploy-message")).to_contain_text(f"Deployed as filter {FILTER}")
    expect(revisions).to_have_count(2)
    assert [item.get_attribute("data-job") for item in revisions.all()] == [str(second), str(first)]
    expect(revisions.first.get_by_test_id("revision-current")).to_be_visible()
    revisions.last.get_by_test_id("revision-rollback").click()
    expect(page.get_by_test_id("revisions-message")).to_have_text(
        f"Rolled {FILTER} back to job {first}: the edges take it within seconds."
    )
    expect(revisions.last.get_by_test_id("revision-current")).to_be_visible()
    expect(revisions.first.get_by_test_id("revision-rollback")).to_be_visible()
    assert rest(cloud, "GET", f"/api/filters/{FILTER}/model").content == first_model
    listed = rest(cloud, "GET", f"/api/filters/{FILTER}/revisions").json()
    assert [(r["job"], r["current"]) for r in listed] == [(second, False), (first, True)]
