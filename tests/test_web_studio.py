"""The filter studio in the web page (docs/studio.md), in real headless Chromium against a real
`filterforward cloud serve` process: datasets listed, uploaded, requested from an edge camera and deleted through
the page; frames labelled by keyboard and an event region drawn by clicking, checked through the REST API.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cloud_server import READ_ONLY, READ_WRITE, TRAINER_TIMEOUT, CloudServer, finish_trainer, run_cloud, start_trainer
from support import signed_in, wait_shown

from models.datasets import LabelledDataset, write_synthetic

playwright_api = pytest.importorskip("playwright.sync_api")
Page = playwright_api.Page
Route = playwright_api.Route
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
FRAMES = 90
FPS = 10.0
SIZE = (160, 96)  # width, height: small frames, a real clip's aspect ratio
TRAINER_TOKEN = "studio-test-trainer-token-0987"
TRAIN_EVENT = "any_object"  # seed 0, 120 frames: positive in 45, two occurrences, so cross-validation runs

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")
expect.set_options(timeout=15_000)  # the page polls every 2 s


@pytest.fixture(scope="module", name="cloud")
def cloud_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    """A cloud whose tokens include a viewer's (read only) and a trainer's (train only), taking trained bundles
    (~150 kB)."""
    tokens = [
        {"name": "operator", "token": READ_WRITE, "scopes": ["read", "write"]},
        {"name": "viewer", "token": READ_ONLY, "scopes": ["read"]},
        {"name": "trainer", "token": TRAINER_TOKEN, "scopes": ["train"]},
    ]
    with run_cloud(tmp_path_factory.mktemp("cloud"), tokens=tokens, max_upload_bytes=2**20) as server:
        yield server


@pytest.fixture(scope="module", name="clip")
def clip_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clip")
    write_synthetic(folder, n_frames=FRAMES, size=SIZE, fps=FPS)
    return folder / "video.mp4"


@pytest.fixture(name="page")
def page_fixture(browser, cloud: CloudServer) -> Iterator[Page]:
    with signed_in(
        browser, cloud.url, READ_WRITE, viewport={"width": 1400, "height": 1000}, accept_downloads=True
    ) as page:
        yield page


def upload(cloud: CloudServer, clip: Path, name: str) -> dict:
    with cloud.client() as client, clip.open("rb") as video:
        answer = client.post("/api/datasets/upload", data={"name": name}, files={"video": ("clip.mp4", video)})
    assert answer.status_code == 201, answer.text
    return answer.json()


def rest(cloud: CloudServer, method: str, path: str, **kwargs: object) -> httpx.Response:
    with cloud.client() as client:
        return client.request(method, path, **kwargs)


def dataset_row(page: Page, name: str):
    return page.locator(f'[data-testid="dataset-row"][data-name="{name}"]')


def open_studio(page: Page, name: str, event: str) -> None:
    dataset_row(page, name).get_by_test_id("dataset-label").click()
    expect(page.get_by_test_id("studio")).to_be_visible()
    expect(page.get_by_test_id("studio-dataset")).to_have_text(name)
    page.get_by_test_id("studio-event").fill(event)
    page.get_by_test_id("studio-event").press("Enter")
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")


def press_labelling(page: Page, keys: str, start: int) -> float:
    """Presses each key (a label key: the page moves on) as soon as the next frame shows; the seconds it took."""
    wait_shown(page, start)
    began = time.perf_counter()
    for offset, key in enumerate(keys, start=1):
        page.keyboard.press(key)
        wait_shown(page, start + offset)
    return time.perf_counter() - began


def test_datasets_are_listed_uploaded_requested_and_deleted(page: Page, cloud: CloudServer, clip: Path) -> None:
    from cloud.db import make_engine, session_factory
    from cloud.framestore import FrameStore
    from cloud.storage import Storage
    from common.protocol import Hello

    upload(cloud, clip, "walkway")
    page.reload()  # the token stays in the page's storage
    row = dataset_row(page, "walkway")
    expect(row.locator('[data-field="source"]')).to_have_text("uploaded clip")
    expect(row.locator('[data-field="status"]')).to_have_text("complete")
    expect(row.locator('[data-field="frames"]')).to_have_text(str(FRAMES))
    expect(row.locator('[data-field="events"]')).to_have_text("—")

    # A recorded clip through the page's upload form, one frame in two.
    form = page.get_by_test_id("upload-form")
    page.get_by_text("Upload a recorded clip").click()
    form.get_by_label("Name of the dataset").fill("from-page")
    form.get_by_label("Keep a frame every (s)").fill("0.2")
    form.get_by_label("Video clip").set_input_files(str(clip))
    form.get_by_test_id("upload-submit").click()
    expect(page.get_by_test_id("upload-message")).to_have_text(f"Uploaded from-page: {FRAMES // 2} frames at 5.0 fps.")
    expect(dataset_row(page, "from-page").locator('[data-field="frames"]')).to_have_text(str(FRAMES // 2))
    form.get_by_label("Name of the dataset").fill("from-page")
    form.get_by_label("Video clip").set_input_files(str(clip))
    form.get_by_test_id("upload-submit").click()
    taken = rest(cloud, "POST", "/api/datasets/upload", data={"name": "from-page"}, files={"video": ("c.mp4", b"x")})
    expect(page.get_by_test_id("upload-message")).to_have_text(f"Not done: {taken.json()['detail']}")

    # Footage from an edge camera: the edge and its cameras come from GET /api/edges.
    storage = Storage(session_factory(make_engine(cloud.config.db_url)), FrameStore(cloud.config.data_dir / "frames"))
    storage.edge_hello("edge-7", Hello(edge="edge-7", run="r1", cameras=["gate", "yard"]), None)
    page.get_by_text("Request footage from a camera").click()
    form = page.get_by_test_id("footage-form")
    expect(form.get_by_label("Edge", exact=True).locator("option")).to_have_text(["edge-7"])
    expect(form.get_by_label("Edge camera").locator("option")).to_have_text(["gate", "yard"])
    form.get_by_label("Edge camera").select_option("yard")
    form.get_by_label("Dataset name").fill("yard-footage")
    form.get_by_label("Every (s)").fill("0.5")
    form.get_by_label("Duration (s)").fill("60")
    form.get_by_label("Max frames").fill("100")
    form.get_by_test_id("footage-submit").click()
    expect(page.get_by_test_id("footage-message")).to_contain_text("Requested yard-footage from edge-7 / yard")
    footage = dataset_row(page, "yard-footage")
    expect(footage.locator('[data-field="status"]')).to_have_text("requested")
    expect(footage.locator('[data-field="source"]')).to_have_text("edge-7 / yard, every 0.5 s")
    stored = rest(cloud, "GET", "/api/datasets/yard-footage").json()
    assert (stored["edge"], stored["camera"], stored["every"], stored["duration"]) == ("edge-7", "yard", 0.5, 60.0)

    # Deleting asks first; a refused confirmation keeps the dataset.
    page.once("dialog", lambda dialog: dialog.dismiss())
    footage.get_by_test_id("dataset-delete").click()
    expect(footage).to_be_visible()
    for name in ("yard-footage", "from-page"):
        page.once("dialog", lambda dialog: dialog.accept())
        dataset_row(page, name).get_by_test_id("dataset-delete").click()
        expect(dataset_row(page, name)).to_have_count(0)
        assert rest(cloud, "GET", f"/api/datasets/{name}").status_code == 404


def test_the_studio_fits_a_phone_without_sideways_scrolling(page: Page, cloud: CloudServer, clip: Path) -> None:
    long_name = "phone-" + "x" * 58  # the longest names allowed do not break on their own
    upload(cloud, clip, long_name)
    open_studio(page, long_name, "e" * 64)
    for width in (1280, 800, 412):
        page.set_viewport_size({"width": width, "height": 900})
        assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_a_dataset_deleted_elsewhere_closes_the_studio_and_says_so(page: Page, cloud: CloudServer, clip: Path) -> None:
    upload(cloud, clip, "gone")
    open_studio(page, "gone", "person")
    assert rest(cloud, "DELETE", "/api/datasets/gone").status_code == 204  # another tab, another user
    expect(page.get_by_test_id("studio")).to_be_hidden(timeout=30_000)
    # It stays said: as an error status it was cleared by the same poll that found the dataset gone.
    expect(page.get_by_test_id("datasets-status")).to_have_text(
        "Dataset gone, open for labelling, was deleted (elsewhere): the studio closed."
    )
    page.wait_for_timeout(4_500)  # two more polls
    expect(page.get_by_test_id("datasets-status")).to_contain_text("was deleted (elsewhere)")


def test_labels_another_tab_stores_reach_the_open_strip(page: Page, cloud: CloudServer, clip: Path) -> None:
    """The counts followed another tab's labels but the strip kept the old ones, and a key press stored over them."""
    upload(cloud, clip, "tabs")
    open_studio(page, "tabs", "person")
    frame = page.locator('[data-testid="strip-item"][data-frame="0"]')
    expect(frame).to_have_class(re.compile(r"\bunlabelled\b"))
    stored = rest(
        cloud, "PUT", "/api/datasets/tabs/labels", json={"event": "person", "labels": [{"frame": 0, "value": 1}]}
    )
    assert stored.status_code == 200  # the other tab
    expect(frame).to_have_class(re.compile(r"\blabel-1\b"), timeout=30_000)  # within a datasets poll (10 s idle)


def test_labels_read_late_leave_the_focus_where_the_user_moved_it(page: Page, cloud: CloudServer, clip: Path) -> None:
    """Opening a dataset focused the frame once its first event's labels were read, even after the user had moved
    on to type another event's name: the Enter that should open it went to the frame, the next keys labelled the
    first event (CI saw a job queued for the wrong event)."""
    upload(cloud, clip, "slow")
    stored = rest(
        cloud, "PUT", "/api/datasets/slow/labels", json={"event": "car", "labels": [{"frame": 0, "value": 0}]}
    )
    assert stored.status_code == 200
    page.reload()
    held: list[Route] = []

    def hold_the_first(route: Route) -> None:
        if held:
            route.continue_()
        else:
            held.append(route)

    page.route(re.compile(r"/api/datasets/slow/labels\?event=car$"), hold_the_first)
    dataset_row(page, "slow").get_by_test_id("dataset-label").click()
    box = page.get_by_test_id("studio-event")
    expect(box).to_have_value("car")
    box.fill("truck")  # typed while the labels of "car" are still being read
    deadline = time.monotonic() + 15
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert held, "the page never read the labels of the first event"
    held[0].continue_()
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    expect(box).to_be_focused()
    box.press("Enter")
    expect(page.get_by_test_id("stage")).to_be_focused()
    page.keyboard.press("1")
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    assert rest(cloud, "GET", "/api/datasets/slow/labels", params={"event": "truck"}).json() == {"truck": {"0": 1}}
    assert rest(cloud, "GET", "/api/datasets/slow/labels", params={"event": "car"}).json() == {"car": {"0": 0}}


def test_an_upload_of_one_frame_says_so_without_a_rate(page: Page, cloud: CloudServer, clip: Path) -> None:
    form = page.get_by_test_id("upload-form")
    page.get_by_text("Upload a recorded clip").click()
    form.get_by_label("Name of the dataset").fill("one-frame")
    form.get_by_label("Keep a frame every (s)").fill("3600")  # one frame of the 9 s clip, at 1/3600 fps
    form.get_by_label("Video clip").set_input_files(str(clip))
    form.get_by_test_id("upload-submit").click()
    expect(page.get_by_test_id("upload-message")).to_have_text("Uploaded one-frame: 1 frame.")
    assert rest(cloud, "DELETE", "/api/datasets/one-frame").status_code == 204


def test_labelling_by_keyboard_and_drawing_a_region(page: Page, cloud: CloudServer, clip: Path) -> None:
    upload(cloud, clip, "labelling")
    page.reload()
    open_studio(page, "labelling", "person")
    strip = page.get_by_test_id("strip-item")

    # 1 x5 and 0 x10: each key labels the current frame and moves on to the next.
    seconds = press_labelling(page, "1" * 5 + "0" * 10, start=0)
    # Move 4 on, then Shift+1: the run after the last labelled frame (14) up to this one, 15..19.
    for _ in range(4):
        page.keyboard.press("ArrowRight")
    wait_shown(page, 19)
    page.keyboard.press("Shift+Digit1")
    wait_shown(page, 20)
    # Shift+arrows select 20..23; u labels the selection uncertain.
    for _ in range(3):
        page.keyboard.press("Shift+ArrowRight")
    expect(page.get_by_test_id("frame-selection")).to_have_text("4 frames selected")
    page.keyboard.press("u")
    wait_shown(page, 24)
    # Back to frame 2 and remove its label with x (the page stays on the frame).
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("x")
    wait_shown(page, 2)
    expect(page.get_by_test_id("frame-label")).to_have_text("unlabelled")

    # A longer stretch at the labeller's pace: 45 more frames, 24..68.
    for _ in range(22):
        page.keyboard.press("ArrowRight")
    run = ("0" * 10 + "1" * 5) * 3
    sustained_seconds = press_labelling(page, run, start=24)

    expected = {0: 1, 1: 1, 3: 1, 4: 1} | dict.fromkeys(range(5, 15), 0) | dict.fromkeys(range(15, 20), 1)
    expected |= dict.fromkeys(range(20, 24), -1)
    expected |= {24 + i: int(key) for i, key in enumerate(run)}
    rate = 15 / seconds
    sustained_rate = len(run) / sustained_seconds
    print(
        f"\nkeyboard labelling: {rate:.1f} frames/s over the first 15 frames, {sustained_rate:.1f} frames/s over "
        f"{len(run)} more (each key pressed once the next frame's image showed; target >= 5 frames/s)"
    )

    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.", timeout=30_000)
    positives = [frame for frame, value in expected.items() if value == 1]
    counts = page.get_by_test_id("studio-counts")
    expect(counts.locator('[data-field="labelled"] dd')).to_have_text(str(len(expected)))
    expect(counts.locator('[data-field="positive"] dd')).to_have_text(str(len(positives)))
    expect(counts.locator('[data-field="uncertain"] dd')).to_have_text("4")
    expect(counts.locator('[data-field="occurrences"] dd')).to_have_text("6")  # 0-1, 3-4, 15-19, three of 5
    stored = rest(cloud, "GET", "/api/datasets/labelling/labels", params={"event": "person"}).json()
    assert {int(frame): value for frame, value in stored["person"].items()} == expected
    dataset = rest(cloud, "GET", "/api/datasets/labelling").json()
    assert dataset["events"]["person"] == {
        "labelled": len(expected), "positive": len(positives), "negative": len(expected) - len(positives) - 4,
        "uncertain": 4, "occurrences": 6,
    }  # fmt: skip

    # The strip around the current frame is coloured by label.
    page.keyboard.press("Home")
    wait_shown(page, 0)
    for frame, colour in [(0, "label-1"), (2, "unlabelled"), (5, "label-0"), (7, "label-0")]:
        expect(page.locator(f'[data-testid="strip-item"][data-frame="{frame}"]')).to_have_class(
            re.compile(rf"\b{colour}\b")
        )
    expect(strip).to_have_count(15)

    # The event region: four clicks on the frame, Enter saves it.
    stage = page.get_by_test_id("stage")
    box = stage.bounding_box()
    corners = [(0.1, 0.2), (0.9, 0.2), (0.9, 0.8), (0.1, 0.8)]
    for x, y in corners:
        stage.click(position={"x": x * box["width"], "y": y * box["height"]})
    page.keyboard.press("Enter")
    message = page.get_by_test_id("region-message")
    expect(message).to_have_text("Region saved (4 points): only what happens inside it counts.")
    region = rest(cloud, "GET", "/api/datasets/labelling").json()["regions"]["person"]
    assert len(region) == len(corners)
    assert [c for point in region for c in point] == pytest.approx([c for point in corners for c in point], abs=0.01)
    assert len(page.get_by_test_id("region-saved").get_attribute("points").split()) == 4

    # Two points (a double click adds one): the page asks for a third and sends nothing, as the API refuses it.
    refused = rest(cloud, "PUT", "/api/datasets/labelling/regions/person", json={"polygon": [[0.1, 0.1], [0.5, 0.5]]})
    assert refused.status_code == 422
    stage.dblclick(position={"x": 0.3 * box["width"], "y": 0.3 * box["height"]})
    stage.click(position={"x": 0.6 * box["width"], "y": 0.6 * box["height"]})
    expect(message).to_have_text("2 points: click 1 more point to close it, Esc cancels.")
    expect(page.get_by_test_id("region-close")).to_be_disabled()
    page.keyboard.press("Enter")
    expect(message).to_have_text("2 points: click 1 more point to close it, Esc cancels.")
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("region-draft")).to_have_attribute("points", "")
    assert rest(cloud, "GET", "/api/datasets/labelling").json()["regions"]["person"] == region

    # labels.csv, fetched with the token and saved through a blob URL.
    with page.expect_download() as download:
        page.get_by_test_id("labels-csv").click()
    csv = Path(download.value.path()).read_text()
    assert csv == rest(cloud, "GET", "/api/datasets/labelling/labels.csv").text
    expect(dataset_row(page, "labelling").locator('[data-event="person"]')).to_have_text(
        f"person: {len(expected)} labelled ({len(positives)} event / {len(expected) - len(positives) - 4} not / "
        "4 uncertain), 6 occurrences"
    )

    # Clear region: the whole frame counts again.
    page.get_by_test_id("region-clear").click()
    expect(message).to_have_text("Region cleared: the whole frame counts.")
    expect(page.get_by_test_id("region-saved")).to_have_attribute("points", "")
    assert "person" not in rest(cloud, "GET", "/api/datasets/labelling").json()["regions"]  # no null left behind


def test_a_failed_label_put_is_retried_and_a_refused_one_shown(page: Page, cloud: CloudServer, clip: Path) -> None:
    upload(cloud, clip, "flaky")
    answers = ["busy"]  # what the next PUTs get instead of the server's answer
    seen = []

    def flaky(route: Route) -> None:
        if route.request.method != "PUT" or not answers:
            route.continue_()
            return
        seen.append(route.request.post_data_json)
        if answers.pop(0) == "busy":
            route.fulfill(status=503, json={"detail": "the database is busy: retry"})
        else:
            route.fulfill(status=422, json={"detail": "frame 2 is refused by this test"})

    page.route("**/api/datasets/flaky/labels", flaky)
    page.reload()
    open_studio(page, "flaky", "car")
    page.keyboard.press("1")
    wait_shown(page, 1)
    page.keyboard.press("0")
    state = page.get_by_test_id("save-state")
    expect(state).to_contain_text("not saved yet: the database is busy: retry")
    expect(state).to_have_text("All labels saved.")  # retried after a second
    assert len(seen) == 1 and seen[0]["labels"][0] == {"frame": 0, "value": 1}  # the first PUT, answered 503
    stored = rest(cloud, "GET", "/api/datasets/flaky/labels", params={"event": "car"}).json()
    assert stored == {"car": {"0": 1, "1": 0}}

    # A refusal no retry can change: shown, and the page reads the stored labels again.
    answers.append("refuse")
    wait_shown(page, 2)
    page.keyboard.press("1")
    expect(state).to_have_text('1 label of "car" refused by the server: frame 2 is refused by this test')
    expect(page.locator('[data-testid="strip-item"][data-frame="2"]')).to_have_class(re.compile(r"\bunlabelled\b"))
    assert rest(cloud, "GET", "/api/datasets/flaky/labels", params={"event": "car"}).json() == stored


@pytest.fixture(scope="module")
def labelled_clip(tmp_path_factory: pytest.TempPathFactory) -> LabelledDataset:
    return write_synthetic(tmp_path_factory.mktemp("labelled"), n_frames=120, size=SIZE, seed=0)


def test_training_a_filter_and_deploying_it_from_the_page(
    page: Page, cloud: CloudServer, labelled_clip: LabelledDataset, base_model: Path, tmp_path: Path
) -> None:
    upload(cloud, labelled_clip.root / "video.mp4", "trainset")
    labels = [{"frame": i, "value": int(v)} for i, v in enumerate(labelled_clip.labels[TRAIN_EVENT])]
    answer = rest(cloud, "PUT", "/api/datasets/trainset/labels", json={"event": TRAIN_EVENT, "labels": labels})
    assert answer.status_code == 200, answer.text
    page.reload()

    # An event without negative labels: the API refuses the job, the page shows why.
    open_studio(page, "trainset", "parked")
    page.keyboard.press("1")
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    page.get_by_test_id("train-submit").click()
    body = {"dataset": "trainset", "event": "parked", "filter": "trainset-parked"}
    refused = rest(cloud, "POST", "/api/training-jobs", json=body)
    assert refused.status_code == 422
    expect(page.get_by_test_id("train-message")).to_have_text(f"Not done: {refused.json()['detail']}")

    page.get_by_test_id("studio-event").fill(TRAIN_EVENT)
    page.get_by_test_id("studio-event").press("Enter")
    expect(page.get_by_test_id("train-filter")).to_have_value(f"trainset-{TRAIN_EVENT}")
    page.get_by_test_id("train-filter").fill("studio-made")
    page.get_by_text("Options (defaults").click()
    page.get_by_label("Training steps").fill("30")
    page.get_by_test_id("train-submit").click()
    expect(page.get_by_test_id("train-message")).to_contain_text("Queued job")
    expect(page.get_by_test_id("job-status")).to_have_text("queued")
    expect(page.get_by_test_id("job-stage")).to_have_text("waiting for a trainer 0%")
    [job] = rest(cloud, "GET", "/api/training-jobs", params={"dataset": "trainset"}).json()
    assert (job["event"], job["filter"], job["options"]["steps"]) == (TRAIN_EVENT, "studio-made", 30)

    # A real trainer takes the job; the page follows its progress live, then shows the report.
    trainer = start_trainer(cloud, TRAINER_TOKEN, base_model, tmp_path, "page-trainer")
    shown = set()
    deadline = time.monotonic() + TRAINER_TIMEOUT
    try:
        while trainer.poll() is None and time.monotonic() < deadline:
            shown.add(page.get_by_test_id("job-stage").text_content())
            time.sleep(0.1)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    finish_trainer(trainer, tmp_path, "page-trainer")
    expect(page.get_by_test_id("job-status")).to_have_text("done")
    print(f"\nthe page showed, while the trainer ran: {sorted(shown)}")
    assert any(re.match(r"(download|features|training|exporting) \d+%$", text or "") for text in shown), shown

    done = rest(cloud, "GET", f"/api/training-jobs/{job['id']}").json()
    report, estimate = done["result"], done["result"]["validation"]
    expect(page.get_by_test_id("job-stage")).to_have_text(f"{done['progress']['stage']} 100%")
    expect(page.get_by_test_id("job-estimate")).to_have_text(
        f"Expected event F1 on new footage: {estimate['event_f1']:.2f} ({estimate['f1_min']:.2f}–"
        f"{estimate['f1_max']:.2f} over {estimate['folds']} folds), precision {estimate['precision']:.2f}, "
        f"recall {estimate['event_recall']:.2f}"
    )
    warnings = page.get_by_test_id("job-warnings").locator("li")
    expect(warnings).to_have_text([f"⚠ {warning}" for warning in report["warnings"]])
    examples = report["examples"]
    for kind, title in [("hits", "Hits"), ("false_alarms", "False alarms"), ("misses", "Misses")]:
        group = page.get_by_test_id(f"examples-{kind}")
        expect(group.locator("h4")).to_have_text(f"{title} ({examples['counts'][kind]})")
        frames = [str(example["frame"]) for example in examples[kind]]
        expect(group.locator("button.example")).to_have_count(len(frames))
        assert [b.get_attribute("data-frame") for b in group.locator("button.example").all()] == frames
    first = examples["hits"][0]["frame"] if examples["hits"] else examples["misses"][0]["frame"]
    thumb = page.locator(f'button.example[data-frame="{first}"]').first
    page.wait_for_function("img => img.naturalWidth > 0", arg=thumb.locator("img").element_handle())
    thumb.click()  # an example frame opens in the labelling view
    wait_shown(page, first)

    # Deploy: the filter reaches the registry and the page's filter list.
    page.get_by_test_id("job-deploy").click()
    message = page.get_by_test_id("deploy-message")
    expect(message).to_contain_text("Deployed as filter studio-made (revision")
    row = page.locator('[data-testid="filter-row"][data-name="studio-made"]')
    expect(row).to_be_visible()
    stored = rest(cloud, "GET", "/api/filters/studio-made").json()
    assert stored["spec"]["event"] == TRAIN_EVENT
    expect(row.locator('[data-field="validation"]')).to_contain_text(f"{estimate['event_f1']:.2f}")
    assert rest(cloud, "GET", f"/api/training-jobs/{job['id']}").json()["deployed"] is True
