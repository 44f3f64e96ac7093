"""Issue 13's end to end test of the filter studio in a browser: headless Chromium drives the web page of a real
`filterforward cloud serve` while a real `filterforward edge run` replays the car clip in real time (looped, so the
camera still plays once the filter is deployed) and a real `filterforward trainer serve` waits for jobs, all on
loopback with CURVE keys. In the page: request footage from the edge's camera, wait until the dataset is complete,
label every frame by keyboard (one key per frame, from the clip's ground truth at the camera frame each footage frame
came from), train, deploy; then the labels stored, the filter and the edge's events of it are checked over REST."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import cv2
import pytest
from cloud_server import READ_WRITE, REPO
from edge_site import CAMERA, EDGE, Site, make_site
from support import wait_shown, wait_until

from models.datasets import open_dataset

playwright_api = pytest.importorskip("playwright.sync_api")
Page = playwright_api.Page
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"), pytest.mark.slow]

EVENT = "vehicle_present"  # the car clip: 146 of its 377 frames, three cars (frames 54-108, 181-238, 315-347)
DATASET = "gate-cars"
FILTER = "gate-cars"
CLIP_SIZE = (384, 216)  # the camera's frames (width, height); the edge's input size is make_site's
LOOPS = 10  # the 30 s clip 10 times over: the camera plays for 5 min, well past the deployment (~70 s in)
# One frame in three (0.24 s at 12.5 fps) for one pass of the clip: all three cars, 126 frames to label.
FOOTAGE = {"every": "0.24", "duration": "30.2", "max_frames": "126"}
KEYS = {1: "1", 0: "0", -1: "u"}
TRAINER_TOKEN = "studio-browser-e2e-trainer-token-4321"
TOKENS = [
    {"name": "operator", "token": READ_WRITE, "scopes": ["read", "write"]},
    {"name": "trainer", "token": TRAINER_TOKEN, "scopes": ["train"]},
]
# Timeouts only keep a broken run from hanging; nothing is asserted on time.
PAGE_WAIT = 20_000  # ms: the page polls every 2 s
FOOTAGE_WAIT = 180_000  # ms: 30 s of recording, then the frames travel behind the matched ones
TRAINER_TIMEOUT = 900.0  # s
EVENT_WAIT = 120.0  # s


@pytest.fixture(scope="module")
def looped_clip(intel_car: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real car clip LOOPS times over as one H.264 file at its 12.5 fps: frame i shows the clip's frame i % 377."""
    dataset = open_dataset(intel_car)
    images = [cv2.resize(image, CLIP_SIZE, interpolation=cv2.INTER_AREA) for _, image in dataset.frames()]
    out = tmp_path_factory.mktemp("clip") / "cars-looped.mp4"
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(25, 2), options={"crf": "18", "preset": "veryfast"})
        stream.width, stream.height, stream.pix_fmt = *CLIP_SIZE, "yuv420p"
        for _ in range(LOOPS):
            for image in images:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")))
        container.mux(stream.encode(None))
    return out


@pytest.fixture
def site(tmp_path: Path, looped_clip: Path, base_model: Path) -> Iterator[Site]:
    site = make_site(tmp_path, looped_clip, "realtime", tokens=TOKENS, max_upload_bytes=2**21)
    site.cloud.start()
    try:
        yield site
    finally:
        if site.cloud.process and site.cloud.process.poll() is None:
            assert site.cloud.stop() == 0, site.cloud.log_text()


@pytest.fixture
def page(browser, site: Site) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], errors  # no uncaught exception in the page's scripts


def start_trainer(site: Site, base_model: Path) -> subprocess.Popen:
    """`filterforward trainer serve` as a service: it polls for jobs until SIGTERM."""
    work = site.root / "trainer"
    work.mkdir()
    command = [sys.executable, "-m", "filterforward", "trainer", "serve", "--cloud", site.cloud.url]
    command += ["--name", "trainer-1", "--work", str(work), "--base-model", str(base_model), "--poll", "0.5"]
    env = {**os.environ, "FF_TRAINER_TOKEN": TRAINER_TOKEN}
    with (site.root / "trainer.log").open("w") as log:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> int:
    """SIGTERM and wait (an orderly stop: status 0); killed if it does not stop."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return -signal.SIGKILL


def camera_frames(site: Site, dataset: str) -> list[int]:
    """The camera frame each footage frame came from, by frame number (labels.csv's camera_frame column)."""
    with site.cloud.client() as client:
        answer = client.get(f"/api/datasets/{dataset}/labels.csv")
    assert answer.status_code == 200, answer.text
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert [int(row["frame_index"]) for row in rows] == list(range(len(rows)))
    return [int(row["camera_frame"]) for row in rows]


def test_footage_labelled_by_keyboard_trained_and_deployed_in_the_browser(
    page: Page, site: Site, intel_car: Path, base_model: Path
) -> None:
    truth_by_clip_frame = open_dataset(intel_car).labels[EVENT]
    started = time.monotonic()
    edge = site.start_edge()
    trainer = start_trainer(site, base_model)
    try:
        page.goto(site.cloud.url + "/")
        page.get_by_label("Bearer token").fill(READ_WRITE)
        page.get_by_test_id("token-save").click()
        online = page.locator(f'[data-testid="edge-row"][data-edge="{EDGE}"] [aria-label="online"]')
        expect(online).to_be_visible(timeout=60_000)  # the edge's hello

        # Footage from the edge's camera, through the page's form.
        page.get_by_text("Request footage from a camera", exact=True).click()
        form = page.get_by_test_id("footage-form")
        expect(form.get_by_label("Edge", exact=True)).to_have_value(EDGE, timeout=PAGE_WAIT)
        form.get_by_label("Edge camera").select_option(CAMERA)
        form.get_by_label("Dataset name").fill(DATASET)
        form.get_by_label("Every (s)").fill(FOOTAGE["every"])
        form.get_by_label("Duration (s)").fill(FOOTAGE["duration"])
        form.get_by_label("Max frames").fill(FOOTAGE["max_frames"])
        form.get_by_test_id("footage-submit").click()
        expect(page.get_by_test_id("footage-message")).to_contain_text(
            f"Requested {DATASET} from {EDGE} / {CAMERA}", timeout=PAGE_WAIT
        )
        row = page.locator(f'[data-testid="dataset-row"][data-name="{DATASET}"]')
        expect(row.locator('[data-field="status"]')).to_have_text("complete", timeout=FOOTAGE_WAIT)
        footage_done = time.monotonic()

        # The person labelling knows, for each frame shown, what the camera saw: the clip's ground truth at the
        # camera frame it came from (the page shows the frames in number order).
        frames = camera_frames(site, DATASET)
        assert len(frames) >= 100, f"only {len(frames)} footage frames"
        expect(row.locator('[data-field="frames"]')).to_have_text(str(len(frames)))
        truth = [int(truth_by_clip_frame[frame % len(truth_by_clip_frame)]) for frame in frames]
        assert 0 < sum(value == 1 for value in truth) < len(truth), "the footage needs frames with and without cars"

        row.get_by_test_id("dataset-label").click()
        expect(page.get_by_test_id("studio")).to_be_visible(timeout=PAGE_WAIT)
        expect(page.get_by_test_id("studio-dataset")).to_have_text(DATASET)
        page.get_by_test_id("studio-event").fill(EVENT)
        page.get_by_test_id("studio-event").press("Enter")
        expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.", timeout=PAGE_WAIT)
        expect(page.get_by_test_id("frame-position")).to_have_text(f"Frame 0 of 0–{len(frames) - 1}")

        # Every frame by keyboard: one key, the page moves on; the next key once the next frame's image shows.
        wait_shown(page, 0, PAGE_WAIT)
        began = time.perf_counter()
        for number, value in enumerate(truth):
            wait_shown(page, number, PAGE_WAIT)
            page.keyboard.press(KEYS[value])
        labelling = time.perf_counter() - began
        expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.", timeout=30_000)
        counts = page.get_by_test_id("studio-counts")
        expect(counts.locator('[data-field="labelled"] dd')).to_have_text(str(len(truth)), timeout=PAGE_WAIT)
        expect(counts.locator('[data-field="positive"] dd')).to_have_text(str(sum(v == 1 for v in truth)))

        # Train: the trainer service takes the job; the page follows it until it is done.
        page.get_by_test_id("train-filter").fill(FILTER)
        page.get_by_test_id("train-submit").click()
        expect(page.get_by_test_id("train-message")).to_contain_text("Queued job", timeout=PAGE_WAIT)
        status = page.get_by_test_id("job-status")
        deadline = time.monotonic() + TRAINER_TIMEOUT
        while status.text_content() not in ("done", "failed"):
            assert trainer.poll() is None, (site.root / "trainer.log").read_text()
            assert time.monotonic() < deadline, f"the job is still {status.text_content()} after {TRAINER_TIMEOUT} s"
            time.sleep(0.5)
        trained = time.monotonic()
        assert status.text_content() == "done", page.get_by_test_id("training").inner_text()
        estimate = page.get_by_test_id("job-estimate").text_content()
        # Footage every 0.24 s is every third camera frame: no background model watches it as the edge's does, so
        # the filter carries no motion veto, and the report says why.
        expect(page.get_by_test_id("job-warnings").locator("li", has_text="no motion veto")).to_contain_text(
            "consecutive camera frames"
        )

        # Deploy, while the camera still plays.
        assert edge.poll() is None, (
            f"the edge stopped before the deployment (the clip is too short?)\n{site.edge_log()}"
        )
        page.get_by_test_id("job-deploy").click()
        expect(page.get_by_test_id("deploy-message")).to_contain_text(
            f"Deployed as filter {FILTER} (revision", timeout=PAGE_WAIT
        )
        expect(page.locator(f'[data-testid="filter-row"][data-name="{FILTER}"]')).to_be_visible(timeout=PAGE_WAIT)
        deployed = time.monotonic()

        with site.cloud.client() as client:
            stored = client.get(f"/api/datasets/{DATASET}/labels", params={"event": EVENT}).json()[EVENT]
            assert {int(frame): value for frame, value in stored.items()} == dict(enumerate(truth))
            spec = client.get(f"/api/filters/{FILTER}").json()["spec"]
            assert (spec["event"], spec["cameras"], spec.get("motion")) == (EVENT, [CAMERA], None)

            def events() -> list[dict]:
                return client.get("/api/events", params={"filter": FILTER}).json()["items"]

            wait_until(events, "an event of the deployed filter from the edge", timeout=EVENT_WAIT)
            first = events()[-1]
            assert (first["edge"], first["camera"], first["filter"]) == (EDGE, CAMERA, FILTER)
        event_seen = time.monotonic()
        # ... and the page's event gallery shows it too.
        card = page.locator(
            '[data-testid="event-card"]', has=page.locator('[data-testid="event-filter"]', has_text=FILTER)
        )
        expect(card.first).to_be_visible(timeout=PAGE_WAIT)
        assert edge.poll() is None, site.edge_log()
    finally:
        edge_status, trainer_status = stop(edge), stop(trainer)
    print(
        f"\nlabelling by keyboard: {len(truth)} frames in {labelling:.1f} s, {len(truth) / labelling:.1f} frames/s "
        f"(each key pressed once the next frame's image showed)\n"
        f"footage complete {footage_done - started:.0f} s, trained {trained - started:.0f} s, deployed "
        f"{deployed - started:.0f} s, first event of the new filter {event_seen - started:.0f} s after the start\n"
        f"the page's report: {estimate}"
    )
    assert edge_status == 0, site.edge_log()
    assert trainer_status == 0, (site.root / "trainer.log").read_text()
    assert "Traceback" not in site.cloud.log_text() and "Traceback" not in site.edge_log()
    assert "Traceback" not in (site.root / "trainer.log").read_text()
