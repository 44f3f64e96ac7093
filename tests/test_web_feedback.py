"""Feedback and revisions in the web page (docs/studio.md, "Feedback and revisions"), in real headless Chromium against
a real `filterforward cloud serve` process and real `filterforward trainer serve --once` processes: an event marked
wrong from the gallery (or frame by frame) and an interval marked missed become labelled frames of the filter's
dataset; the studio
proposes the frames the trained filter is least sure about, trains a new revision, shows the two estimates side by
side, and rolls the filter back from its revisions list. What the page shows is read from the jobs the trainer
finished (GET /api/training-jobs/{id})."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import cv2
import pytest
from cloud_server import READ_WRITE, CloudServer, finish_trainer, job_model, run_cloud, start_trainer
from support import signed_in, wait_shown

from models.datasets import LabelledDataset, write_synthetic

playwright_api = pytest.importorskip("playwright.sync_api")
Page = playwright_api.Page
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")
expect.set_options(timeout=15_000)  # the page polls every 2 s

TRAINER_TOKEN = "feedback-page-trainer-token-1357"
SIZE = (160, 96)  # small frames: the trainer's input size follows them
STEPS = 30  # a short training (the job option); the page's new revision takes the same options
DATASET, EVENT, FILTER = "porch", "any_object", "porch-object"
UNLABELLED = range(70, 100)  # frames left without a label: the ones a filter proposes to label next
UNCERTAIN_SHOWN = 12  # the frames to label next the page shows at most (studio.js)
KEYS = {1: "1", 0: "0", -1: "u"}  # the studio's key for a label
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


def labels(cloud: CloudServer) -> dict[int, int]:
    stored = rest(cloud, "GET", f"/api/datasets/{DATASET}/labels", params={"event": EVENT}).json()
    return {int(frame): value for frame, value in stored.get(EVENT, {}).items()}


def run_trainer(cloud: CloudServer, base_model: Path, work: Path, name: str) -> None:
    """A real trainer takes the queued job, trains it and reports (`filterforward trainer serve --once`)."""
    finish_trainer(start_trainer(cloud, TRAINER_TOKEN, base_model, work, name), work, name)


def job(cloud: CloudServer, job_id: int) -> dict[str, Any]:
    done = rest(cloud, "GET", f"/api/training-jobs/{job_id}").json()
    assert done["status"] == "done", done
    return done


def fixed(value: float | None) -> str:
    """A number as the page writes it (JavaScript's toFixed(2): the exact value rounded, halves up), "–" for none."""
    return "–" if value is None else str(Decimal(value).quantize(Decimal("0.01"), ROUND_HALF_UP))


def estimate_cell(done: dict[str, Any]) -> str:
    """The compare table's estimate of a job: event F1 and its spread over the folds."""
    validation = done["result"].get("validation") or done["spec"].get("validation")
    if not validation:
        return "–"
    return f"{fixed(validation.get('event_f1'))} ({fixed(validation.get('f1_min'))}–{fixed(validation.get('f1_max'))})"


def frames_cell(done: dict[str, Any]) -> str:
    return f"{done['result']['positives']} event / {done['result']['negatives']} not"


def proposed(done: dict[str, Any], labelled: dict[int, int]) -> list[str]:
    """The frames the page proposes to label next: the job's uncertain frames that have no label, least sure first."""
    return [str(e["frame"]) for e in done["result"]["uncertain"] if e["frame"] not in labelled][:UNCERTAIN_SHOWN]


@pytest.fixture(scope="module")
def first_job(cloud: CloudServer, base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The filter's first revision: queued over REST, trained by a real trainer, deployed."""
    body = {"dataset": DATASET, "event": EVENT, "filter": FILTER, "options": {"steps": STEPS}}
    queued = rest(cloud, "POST", "/api/training-jobs", json=body)
    assert queued.status_code == 201, queued.text
    run_trainer(cloud, base_model, tmp_path_factory.mktemp("trainer"), "trainer-1")
    deployed = rest(cloud, "POST", f"/api/training-jobs/{queued.json()['id']}/deploy")
    assert deployed.status_code == 200, deployed.text
    return job(cloud, queued.json()["id"])


@pytest.fixture
def page(browser, cloud: CloudServer) -> Iterator[Page]:
    viewport = {"width": 1400, "height": 1000}
    with signed_in(browser, cloud.url, READ_WRITE, viewport=viewport, timezone_id="UTC") as page:
        yield page


def test_feedback_from_the_gallery_a_new_revision_and_a_rollback(
    page: Page, cloud: CloudServer, clip: LabelledDataset, first_job: dict[str, Any], base_model: Path, tmp_path: Path
) -> None:
    first = first_job["id"]
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

    # A filter that does not exist (one registered by hand would have no dataset: tests/test_feedback.py): the
    # refusal says so.
    page.get_by_text("Mark an interval a filter missed").click()
    form = page.get_by_test_id("missed-form")
    expect(form.get_by_label("On camera").locator("option")).to_have_text([f"{CAMERA} ({EDGE})"])
    form.get_by_label("Filter that missed it").fill("by-hand")
    form.get_by_label("From").fill(local(wall(390)))
    form.get_by_label("Until").fill(local(wall(410)))
    form.get_by_test_id("missed-submit").click()
    expect(page.get_by_test_id("missed-message")).to_contain_text(
        "Not added: no filter named 'by-hand': list the filters with GET /api/filters"
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

    # The studio: the frames the first revision proposes to label next (its uncertain ones without a label).
    page.locator(f'[data-testid="dataset-row"][data-name="{DATASET}"]').get_by_test_id("dataset-label").click()
    page.get_by_test_id("studio-event").fill(EVENT)
    page.get_by_test_id("studio-event").press("Enter")
    improve = page.get_by_test_id("improve")
    expect(improve).to_be_visible()
    shown = proposed(first_job, labels(cloud))
    buttons = improve.get_by_test_id("uncertain-frames").locator("button.example")
    expect(buttons).to_have_count(len(shown))
    assert [button.get_attribute("data-frame") for button in buttons.all()] == shown
    if shown:  # one opened from the proposals
        target = int(shown[-1])
        buttons.last.click()
    else:  # the trainer proposed no frame: the first unlabelled frame is labelled by keyboard instead
        target = next(frame for frame in range(before["frames"]) if frame not in labels(cloud))
        page.get_by_test_id("stage").focus()
        page.keyboard.press("Home")
        for _ in range(target):
            page.keyboard.press("ArrowRight")
    wait_shown(page, target)
    truth = int(clip.labels[EVENT][target])
    page.keyboard.press(KEYS[truth])  # labelled: it is proposed no more
    expect(improve.get_by_test_id("uncertain-frames").locator(f'[data-frame="{target}"]')).to_have_count(0)
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    assert labels(cloud)[target] == truth
    counts = rest(cloud, "GET", f"/api/datasets/{DATASET}").json()["events"][EVENT]
    assert (counts["positive"], counts["negative"]) == (
        after["events"][EVENT]["positive"] + (truth == 1), after["events"][EVENT]["negative"] + (truth == 0)
    )  # fmt: skip
    revisions = page.get_by_test_id("revision")
    expect(revisions).to_have_count(1)
    expect(revisions.first.get_by_test_id("revision-current")).to_have_text("current")

    # A new revision: queued from the page, trained by a real trainer; the two estimates side by side.
    improve.get_by_test_id("train-revision").click()
    expect(page.get_by_test_id("train-message")).to_contain_text(f"a new revision of {FILTER}")
    expect(page.get_by_test_id("job-status")).to_have_text("queued")
    [queued] = [item for item in rest(cloud, "GET", "/api/training-jobs").json() if item["status"] == "queued"]
    assert (queued["filter"], queued["options"]["steps"]) == (FILTER, STEPS)
    run_trainer(cloud, base_model, tmp_path, "trainer-2")
    expect(page.get_by_test_id("job-status")).to_have_text("done")
    second_job = job(cloud, queued["id"])
    second = second_job["id"]
    assert (second_job["result"]["positives"], second_job["result"]["negatives"]) == (
        counts["positive"], counts["negative"]
    )  # fmt: skip
    compare = page.get_by_test_id("compare")
    expect(compare.locator("thead th")).to_have_text([f"Job {first}", f"Job {second}"])
    expect(compare.locator('[data-field="f1"] td')).to_have_text([estimate_cell(first_job), estimate_cell(second_job)])
    expect(compare.locator('[data-field="frames"] td')).to_have_text([frames_cell(first_job), frames_cell(second_job)])
    shown = proposed(second_job, labels(cloud))
    buttons = page.get_by_test_id("uncertain-frames").locator("button.example")
    expect(buttons).to_have_count(len(shown))
    assert [button.get_attribute("data-frame") for button in buttons.all()] == shown
    assert str(target) not in shown

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
    expect(page.get_by_test_id("deploy-message")).to_have_text(  # the training panel shows the second job
        f"Filter {FILTER} runs job {first} now: Deploy again puts this one back."
    )
    assert rest(cloud, "GET", f"/api/filters/{FILTER}/model").content == job_model(cloud, first)
    listed = rest(cloud, "GET", f"/api/filters/{FILTER}/revisions").json()
    assert [(r["job"], r["current"]) for r in listed] == [(second, False), (first, True)]


def test_an_events_frames_marked_one_by_one(page: Page, cloud: CloudServer, first_job: dict[str, Any]) -> None:
    """ "Mark frames…": the event's first frame shows the event, the rest do not (a click cycles a frame's mark, a
    shift-click gives the frames since the last click the same mark); unmarked frames are left alone."""
    page.get_by_test_id("event-card").get_by_test_id("event-mark-frames").click()
    dialog = page.get_by_test_id("mark-dialog")
    frames = dialog.get_by_test_id("mark-frame")
    expect(frames).to_have_count(4)
    expect(frames.locator("img")).to_have_count(4)  # each frame's image, fetched with the page's token
    dialog.get_by_test_id("mark-save").click()
    expect(dialog.get_by_test_id("mark-message")).to_have_text("Mark a frame first: click it.")
    frames.nth(0).click()  # shows the event
    frames.nth(1).click()
    frames.nth(1).click()  # does not
    frames.nth(3).click(modifiers=["Shift"])  # nor do the frames up to the fourth
    assert [frame.get_attribute("data-mark") for frame in frames.all()] == ["1", "0", "0", "0"]
    dialog.get_by_test_id("mark-save").click()
    expect(dialog.get_by_test_id("mark-message")).to_have_text(
        re.compile(
            rf"1 frame labelled with {EVENT} in dataset {DATASET} \(\d new\)\. "
            rf"3 frames labelled without {EVENT} in dataset {DATASET} \(\d new\)\."
        )
    )
    # The event's four frames are the first the feedback added to the dataset (after its 120 own frames).
    assert [labels(cloud).get(frame) for frame in range(120, 124)] == [1, 0, 0, 0]


def test_a_deleted_filters_revisions_say_so_and_a_rollback_asks_first(
    page: Page, cloud: CloudServer, first_job: dict[str, Any]
) -> None:
    """Rolling back a deleted filter would register it again: the page asks, and a refusal leaves it deleted."""
    page.locator(f'[data-testid="dataset-row"][data-name="{DATASET}"]').get_by_test_id("dataset-label").click()
    page.get_by_test_id("studio-event").fill(EVENT)
    page.get_by_test_id("studio-event").press("Enter")
    expect(page.get_by_test_id("revision-current")).to_have_count(1)
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f'[data-testid="filter-row"][data-name="{FILTER}"]').get_by_test_id("filter-delete").click()
    expect(page.get_by_test_id("revisions-deleted")).to_be_visible()  # the panel is read again
    expect(page.get_by_test_id("revision-current")).to_have_count(0)
    expect(page.get_by_test_id("deploy-message")).to_have_text(
        f"Filter {FILTER} was deleted: Deploy again registers it."
    )

    asked: list[str] = []
    message = page.get_by_test_id("revisions-message")
    revision = page.get_by_test_id("revision").first
    job_id = revision.get_attribute("data-job")
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    revision.get_by_test_id("revision-rollback").click()
    expect(message).to_have_text(f"Not rolled back: {FILTER} was deleted and stays deleted.")
    assert asked == [f"Filter {FILTER} was deleted. Register it again with job {job_id}'s model?"]
    assert rest(cloud, "GET", f"/api/filters/{FILTER}").status_code == 404

    page.once("dialog", lambda dialog: dialog.accept())  # asked again, and accepted: registered again
    revision.get_by_test_id("revision-rollback").click()
    expect(message).to_have_text(f"Rolled {FILTER} back to job {job_id}: the edges take it within seconds.")
    assert rest(cloud, "GET", f"/api/filters/{FILTER}").status_code == 200
    expect(page.get_by_test_id("revisions-deleted")).to_have_count(0)
    expect(page.locator("#revisions")).not_to_contain_text("null")  # the missing note was shown as "null"


def test_deploying_a_job_for_another_event_in_a_filter_s_place_asks_first(
    page: Page, cloud: CloudServer, clip: LabelledDataset, first_job: dict[str, Any], base_model: Path, tmp_path: Path
) -> None:
    """A job trained under a running filter's name for another event replaced it with one click."""
    other = "red_in_region"
    given = [{"frame": i, "value": int(v)} for i, v in enumerate(clip.labels[other]) if v != -1]
    assert rest(cloud, "PUT", f"/api/datasets/{DATASET}/labels", json={"event": other, "labels": given}).is_success
    body = {"dataset": DATASET, "event": other, "filter": FILTER, "options": {"steps": STEPS}}
    assert rest(cloud, "POST", "/api/training-jobs", json=body).status_code == 201
    run_trainer(cloud, base_model, tmp_path, "trainer-other")
    page.locator(f'[data-testid="dataset-row"][data-name="{DATASET}"]').get_by_test_id("dataset-label").click()
    page.get_by_test_id("studio-event").fill(other)
    page.get_by_test_id("studio-event").press("Enter")
    expect(page.get_by_test_id("job-status")).to_have_text("done")
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.get_by_test_id("job-deploy").click()
    kept = f"Not deployed: filter {FILTER} keeps the model it runs."
    expect(page.get_by_test_id("deploy-message")).to_have_text(kept)
    assert asked == [f'Filter {FILTER} filters for event "{EVENT}"; this job learned "{other}". Replace it?']
    assert rest(cloud, "GET", f"/api/filters/{FILTER}").json()["spec"]["event"] == EVENT
