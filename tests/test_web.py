"""The operator page in real headless Chromium against a real `filterforward cloud serve` process.

The page registers filters through its form with real exported ONNX models, and shows events that the
cloud's own storage layer writes into the server's database while the page stays open (no reload).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
from cloud_server import READ_WRITE, run_cloud
from support import beat_from_two_processes

from cloud.config import CloudConfig
from models.filterspec import FilterSpec, MotionVeto, Smoothing, Validation
from models.mc_kinds import MC_KINDS
from models.roi import ROI

playwright_api = pytest.importorskip("playwright.sync_api")
Page = playwright_api.Page
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
TOKEN = READ_WRITE
THUMB_SIZE = (64, 48)  # width, height of the test frame

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")
expect.set_options(timeout=15_000)  # the page polls every 2 s


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudConfig]:
    """A real cloud server process on free loopback ports, with a SQLite database in its data_dir."""
    with run_cloud(tmp_path_factory.mktemp("cloud")) as server:
        yield server.config


@pytest.fixture
def page(browser, cloud: CloudConfig) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    page.goto(cloud.base_url + "/")
    try:
        yield page
    finally:
        context.close()


def sign_in(page: Page, token: str) -> None:
    page.get_by_label("Bearer token").fill(token)
    page.get_by_test_id("token-save").click()


def fill_filter_form(page: Page, spec: FilterSpec, model: Path) -> None:
    page.get_by_label("Name", exact=True).fill(spec.name)
    page.get_by_label("Event label").fill(spec.event)
    page.get_by_label("Cameras (comma-separated, * for all)").fill(", ".join(spec.cameras))
    architecture = page.get_by_label("Architecture")
    expect(architecture.locator("option")).to_have_text(list(MC_KINDS))  # the registry's kinds, via the schema
    architecture.select_option(spec.architecture)
    page.get_by_label("Tap").select_option(spec.tap)
    page.get_by_label("Input width (px)").fill(str(spec.input_size[0]))
    page.get_by_label("Input height (px)").fill(str(spec.input_size[1]))
    page.get_by_label("ONNX model").set_input_files(str(model))
    page.get_by_test_id("filter-submit").click()


def api(cloud: CloudConfig, method: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.request(method, cloud.base_url + path, headers=headers, timeout=30, **kwargs)


def test_token_and_filter_registration(
    page: Page, cloud: CloudConfig, make_filter: Callable[..., tuple[FilterSpec, bytes]], tmp_path: Path
) -> None:
    banner = page.get_by_test_id("auth-error")
    expect(banner).to_contain_text("Enter a bearer token")

    # A wrong token: the server's own 401 detail is shown.
    wrong = "not-a-valid-token-at-all-000"
    detail = httpx.get(cloud.base_url + "/api/filters", headers={"Authorization": f"Bearer {wrong}"}).json()["detail"]
    sign_in(page, wrong)
    expect(banner).to_contain_text(detail)
    sign_in(page, TOKEN)
    expect(banner).to_be_hidden()
    expect(page.get_by_test_id("filters-table")).to_contain_text("No filters registered yet.")

    spec, onnx = make_filter(
        "full_frame", "late", (128, 96), name="red-car", event="red_car", cameras=["cam-1", "cam-2"]
    )
    model = tmp_path / "red-car.onnx"
    model.write_bytes(onnx)
    fill_filter_form(page, spec, model)
    row = page.locator('[data-testid="filter-row"][data-name="red-car"]')
    expect(row).to_be_visible()
    expect(row.locator('[data-field="architecture"]')).to_have_text("full_frame")
    expect(row.locator('[data-field="tap"]')).to_have_text("late @ 128×96")
    expect(row.locator('[data-field="cameras"]')).to_have_text("cam-1, cam-2")
    expect(row.locator('[data-field="threshold"]')).to_have_text("0.5 · 3/5")
    expect(row.locator('[data-field="validation"]')).to_have_text("—")  # registered without an estimate
    expect(row.locator('[data-field="encoding"]')).to_have_text("H.264 stream")  # the default
    expect(row.locator('[data-field="version"]')).to_have_text("1")
    for width in (1280, 800, 412):  # tables scroll in their box; the page never scrolls sideways (412: a phone)
        page.set_viewport_size({"width": width, "height": 800})
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    expect(page.get_by_test_id("filter-form-message")).to_contain_text("Registered red-car")
    stored = api(cloud, "GET", "/api/filters/red-car").json()
    assert stored["spec"] == spec.model_dump(mode="json")

    # A model exported for 64x64 frames under a spec that says 128x96: refused with the server's detail.
    _, wrong_onnx = make_filter("full_frame", "late", (64, 64), name="bad-shape")
    bad_model = tmp_path / "bad-shape.onnx"
    bad_model.write_bytes(wrong_onnx)
    bad_spec = FilterSpec(name="bad-shape", architecture="full_frame", tap="late", input_size=(128, 96))
    fill_filter_form(page, bad_spec, bad_model)
    message = page.get_by_test_id("filter-form-message")
    expect(message).to_have_class("message error")
    refused = api(
        cloud,
        "POST",
        "/api/filters",
        data={"spec": bad_spec.model_dump_json()},
        files={"model": ("bad-shape.onnx", wrong_onnx, "application/octet-stream")},
    )
    assert refused.status_code in (400, 409, 413, 422), refused.text
    expect(message).to_have_text(f"Not registered: {refused.json()['detail']}")
    assert [f["name"] for f in api(cloud, "GET", "/api/filters").json()] == ["red-car"]

    # Delete through the table (accepting the confirmation dialog).
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_test_id("filter-delete").click()
    expect(page.get_by_test_id("filter-row")).to_have_count(0)
    assert api(cloud, "GET", "/api/filters").json() == []

    # A bundle from `filterforward train` carries its cross-validated estimate and warnings: shown in the row.
    estimate = Validation(
        event_f1=0.93, f1_min=0.875, f1_max=1.0, precision=0.9, event_recall=1.0, folds=3, occurrences=3,
        method="occurrences", warnings=("only 12 frames show the event: label at least 20",),
    )  # fmt: skip
    vetted = spec.model_copy(update={"name": "vetted", "validation": estimate})
    files = {"model": ("vetted.onnx", onnx, "application/octet-stream")}
    assert api(cloud, "POST", "/api/filters", data={"spec": vetted.model_dump_json()}, files=files).status_code == 201
    cell = page.locator('[data-testid="filter-row"][data-name="vetted"] [data-field="validation"]')
    expect(cell).to_have_text("0.93 (0.88–1.00) ⚠ 1")
    expect(cell).to_have_attribute("title", re.compile(r"3 folds, whole occurrences held out\n⚠ only 12 frames"))
    assert api(cloud, "DELETE", "/api/filters/vetted").status_code == 204

    # One trained on too few frames to cross-validate carries why, and what to label, in its spec instead.
    advice = ("no cross-validation: the training frames are too few", "only 3 frames are without the event")
    moving = MotionVeto(min_foreground=0.0125, frames=5)  # and needs motion in its region: shown with the threshold
    unvetted = spec.model_copy(update={"name": "unvetted", "warnings": advice, "motion": moving})
    files = {"model": ("unvetted.onnx", onnx, "application/octet-stream")}
    assert api(cloud, "POST", "/api/filters", data={"spec": unvetted.model_dump_json()}, files=files).status_code == 201
    cell = page.locator('[data-testid="filter-row"][data-name="unvetted"] [data-field="validation"]')
    expect(cell).to_have_text("— ⚠ 2")
    expect(cell).to_have_attribute("title", "trained without cross-validation\n⚠ " + "\n⚠ ".join(advice))
    threshold = page.locator('[data-testid="filter-row"][data-name="unvetted"] [data-field="threshold"]')
    expect(threshold).to_have_text("0.5 · 3/5 · moving ≥ 1.25%")
    expect(threshold).to_have_attribute("title", re.compile(r"1\.25% of the region.s pixels moved in its last 5"))


def test_live_stats_and_events_without_reload(page: Page, cloud: CloudConfig) -> None:
    from cloud.db import make_engine, session_factory
    from cloud.framestore import FrameStore
    from cloud.storage import Storage
    from common.protocol import EventHeader, EventInfo, FrameHeader, Hello, Stats

    sign_in(page, TOKEN)
    expect(page.get_by_test_id("events-status")).to_contain_text("No events yet")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    storage = Storage(session_factory(make_engine(cloud.db_url)), FrameStore(cloud.data_dir / "frames"))
    storage.edge_hello("edge-1", Hello(edge="edge-1", run="run-1", cameras=["cam-1"]), None)
    camera_stats = {"fps": 12.5, "base_ms": 40.25, "mc_ms": 0.75, "frames": 250, "matched": 9, "bytes_out": 20480}
    uplink = {"connected": True, "spool_messages": 3, "spool_bytes": 4096, "spool_dropped": 0, "sent_bytes": 10240}
    stats = Stats(edge="edge-1", cameras={"cam-1": {**camera_stats, "dropped": 2, "online": True}}, uplink=uplink)
    storage.edge_stats("edge-1", stats)

    camera = page.locator('[data-testid="camera-row"][data-camera="cam-1"]')
    expect(camera.locator('[data-field="fps"]')).to_have_text("12.5")
    expect(camera.locator('[data-field="base_ms"]')).to_have_text("40.3")
    expect(camera.locator('[data-field="dropped"]')).to_have_text("2")
    expect(camera.locator('[data-field="bytes_out"]')).to_have_text("20.0 KiB")
    edge = page.locator('[data-testid="edge-row"][data-edge="edge-1"]')
    expect(edge.locator('[data-field="spool_messages"]')).to_have_text("3")
    expect(edge.locator(".dot.online")).to_have_count(1)

    jpeg = cv2.imencode(".jpg", np.full((THUMB_SIZE[1], THUMB_SIZE[0], 3), (0, 0, 200), np.uint8))[1].tobytes()
    info = EventInfo(id="ev-1", filter="red-car", camera="cam-1", start_frame=10, start_time=0.8, peak_score=0.93)
    common = {"edge": "edge-1", "run": "run-1"}
    storage.store_event("edge-1", EventHeader(**common, seq=1, phase="start", wall_time=time.time(), event=info), b"")
    frame = FrameHeader(
        **common, seq=2, camera="cam-1", frame=10, timestamp=0.8, wall_time=time.time(), scores={"red-car": 0.93}
    )
    storage.store_frame("edge-1", frame.model_copy(update={"events": ["ev-1"]}), jpeg)

    card = page.get_by_test_id("event-card")
    expect(card).to_have_count(1)
    expect(card.get_by_test_id("event-filter")).to_have_text("red-car")
    expect(card.get_by_test_id("event-camera")).to_have_text("cam-1")
    expect(card.get_by_test_id("event-peak")).to_have_text("0.930")
    expect(card.get_by_test_id("event-state")).to_have_text("open")
    thumb = card.get_by_test_id("event-thumb")
    expect(thumb).to_be_visible()
    page.wait_for_function("document.querySelector('[data-testid=event-thumb]')?.naturalWidth > 0")
    assert thumb.evaluate("img => img.naturalWidth") == THUMB_SIZE[0]
    thumb_handle = thumb.element_handle()

    # The event ends and a second one starts: the first card updates in place, the new one goes on top.
    ended = info.model_copy(update={"end_frame": 30, "end_time": 2.5})
    storage.store_event("edge-1", EventHeader(**common, seq=3, phase="end", wall_time=time.time(), event=ended), b"")
    second = info.model_copy(update={"id": "ev-2", "start_frame": 40, "start_time": 3.3, "peak_score": 0.71})
    storage.store_event("edge-1", EventHeader(**common, seq=4, phase="start", wall_time=time.time(), event=second), b"")
    expect(card).to_have_count(2)
    expect(card.first.get_by_test_id("event-peak")).to_have_text("0.710")
    expect(card.nth(1).get_by_test_id("event-state")).to_have_text("ended")
    assert thumb_handle.evaluate("img => img.isConnected && img.naturalWidth > 0")  # not re-rendered
    assert page.evaluate("window.__sameDocument === true")

    # Filtering by camera asks the server again; clearing it brings both back.
    page.get_by_label("Camera", exact=True).fill("cam-9")
    expect(card).to_have_count(0)
    expect(page.get_by_test_id("events-status")).to_have_text(
        'No events match camera "cam-9": "Show all" lists every event.'
    )
    page.get_by_label("Camera", exact=True).fill("")
    expect(card).to_have_count(2)


def test_an_edge_shows_its_base_model_and_the_filters_it_refuses(
    page: Page, cloud: CloudConfig, make_filter: Callable[..., tuple[FilterSpec, bytes]]
) -> None:
    from cloud.db import make_engine, session_factory
    from cloud.framestore import FrameStore
    from cloud.storage import Storage
    from common.protocol import Hello
    from models.filterspec import BaseModelId

    trained_on = BaseModelId(name="efficientnet-lite0", precision="fp32", digest="0123456789abcdef")
    runs = trained_on.model_copy(update={"precision": "int8", "digest": "fedcba9876543210"})
    spec, onnx = make_filter("full_frame", "late", (128, 96), name="fp32-only", cameras=["gate-cam"])
    spec = spec.model_copy(update={"base_model": trained_on})
    files = {"model": ("fp32-only.onnx", onnx, "application/octet-stream")}
    assert api(cloud, "POST", "/api/filters", data={"spec": spec.model_dump_json()}, files=files).status_code == 201
    storage = Storage(session_factory(make_engine(cloud.db_url)), FrameStore(cloud.data_dir / "frames"))
    storage.edge_hello("edge-int8", Hello(edge="edge-int8", run="r1", cameras=["gate-cam"], base_model=runs), None)

    sign_in(page, TOKEN)
    cell = page.locator('[data-testid="edge-row"][data-edge="edge-int8"] [data-field="base_model"]')
    expect(cell).to_have_text("efficientnet-lite0 int8 ⚠ refuses 1")
    expect(cell).to_have_attribute("title", re.compile(r"^refuses fp32-only: trained on another base model"))
    note = page.locator('[data-testid="filter-row"][data-name="fp32-only"]').get_by_test_id("filter-refused")
    expect(note).to_have_text("⚠ refused by edge edge-int8")  # the filter's row says it too
    assert api(cloud, "DELETE", "/api/filters/fp32-only").status_code == 204
    page.reload()
    sign_in(page, TOKEN)
    expect(cell).to_have_text("efficientnet-lite0 int8")
    expect(cell).to_have_attribute("title", "digest fedcba9876543210")


def test_an_offline_edge_shows_no_stale_uplink_and_a_shared_edge_id_is_flagged(page: Page, cloud: CloudConfig) -> None:
    from datetime import timedelta

    from sqlalchemy import update

    from cloud.db import Edge, make_engine, session_factory, utcnow
    from cloud.framestore import FrameStore
    from cloud.storage import Storage
    from common.protocol import Hello, Stats

    sessions = session_factory(make_engine(cloud.db_url))
    storage = Storage(sessions, FrameStore(cloud.data_dir / "frames"))
    storage.edge_hello("edge-gone", Hello(edge="edge-gone", run="r1", cameras=[]), None)
    storage.edge_stats("edge-gone", Stats(edge="edge-gone", uplink={"connected": True}))
    with sessions.begin() as session:  # its last word was an hour ago, while its uplink was up
        session.execute(update(Edge).where(Edge.id == "edge-gone").values(last_seen=utcnow() - timedelta(hours=1)))
    beat_from_two_processes(cloud.zmq.ingest_port, "edge-twin")

    sign_in(page, TOKEN)
    gone = page.locator('[data-testid="edge-row"][data-edge="edge-gone"]')
    expect(gone.locator('[data-field="connected"]')).to_have_text("edge offline")
    expect(gone.get_by_test_id("shared-id")).to_have_count(0)
    twin = page.locator('[data-testid="edge-row"][data-edge="edge-twin"]')
    expect(twin.get_by_test_id("shared-id")).to_have_text("⚠ two edges use this id")

    # An edge gone for good is forgotten from its row; an online one has nothing to forget it with.
    expect(twin.get_by_test_id("edge-forget")).to_have_count(0)
    page.once("dialog", lambda dialog: dialog.accept())
    gone.get_by_test_id("edge-forget").click()
    expect(page.get_by_test_id("edges-status")).to_have_text("Forgot edge edge-gone.")
    expect(gone).to_have_count(0)
    assert api(cloud, "GET", "/api/edges/edge-gone").status_code == 404


def test_a_bundles_spec_fills_the_form_and_keeps_what_the_form_has_no_field_for(
    page: Page, cloud: CloudConfig, make_filter: Callable[..., tuple[FilterSpec, bytes]], tmp_path: Path
) -> None:
    sign_in(page, TOKEN)
    estimate = Validation(
        event_f1=0.91, f1_min=0.8, f1_max=1.0, precision=0.95, event_recall=0.9, folds=3, occurrences=4,
        method="occurrences", warnings=(),
    )  # fmt: skip
    spec, onnx = make_filter(
        "full_frame", "mid", (128, 96), name="walkway", event="person_near", cameras=["gate"],
        roi=ROI(polygon=((0.1, 0.5), (0.6, 0.5), (0.8, 1.0), (0.0, 1.0)), context=1),
        smoothing=Smoothing(threshold=0.62, k=2, n=4), motion=MotionVeto(min_foreground=0.01, frames=5),
        validation=estimate,
    )  # fmt: skip
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "spec.json").write_text(spec.model_dump_json(indent=2))
    (bundle / "model.onnx").write_bytes(onnx)
    message = page.get_by_test_id("filter-form-message")

    page.get_by_test_id("f-spec").set_input_files(str(bundle / "spec.json"))
    expect(message).to_have_text("Filled from spec.json: choose the bundle's model.onnx and register it.")
    expect(page.get_by_label("Name", exact=True)).to_have_value("walkway")
    expect(page.get_by_label("Tap")).to_have_value("mid")
    expect(page.get_by_label("Input height (px)")).to_have_value("96")
    expect(page.get_by_label("Threshold")).to_have_value("0.62")
    expect(page.get_by_label("y0")).to_have_value("0.5")  # the polygon's bounding box
    page.get_by_label("Name", exact=True).fill("walkway-copy")  # what the form changes wins
    page.get_by_label("ONNX model").set_input_files(str(bundle / "model.onnx"))
    page.get_by_test_id("filter-submit").click()
    expect(message).to_contain_text("Registered walkway-copy")
    # The polygon, its context, the motion veto and the estimate came along from the file.
    stored = api(cloud, "GET", "/api/filters/walkway-copy").json()["spec"]
    assert stored == spec.model_copy(update={"name": "walkway-copy"}).model_dump(mode="json")
    expect(page.get_by_test_id("f-spec")).to_have_value("")

    notes = tmp_path / "notes.json"
    notes.write_text("{not json")
    page.get_by_test_id("f-spec").set_input_files(str(notes))
    expect(message).to_have_class("message error")
    expect(message).to_contain_text("notes.json is not JSON")
    assert api(cloud, "DELETE", "/api/filters/walkway-copy").status_code == 204


def test_forget_and_a_refused_token_clear_what_was_shown(page: Page, cloud: CloudConfig, tmp_path: Path) -> None:
    """Nothing a previous token read stays on screen once the token is forgotten or a wrong one is given."""
    from cloud.db import make_engine, session_factory
    from cloud.framestore import FrameStore
    from cloud.storage import Storage
    from common.protocol import EventHeader, EventInfo, Hello
    from models.datasets import write_synthetic

    storage = Storage(session_factory(make_engine(cloud.db_url)), FrameStore(cloud.data_dir / "frames"))
    storage.edge_hello("edge-forget", Hello(edge="edge-forget", run="run-forget", cameras=["cam-forget"]), None)
    info = EventInfo(id="ev-forget", filter="seen", camera="cam-forget", start_frame=1, start_time=0.1, peak_score=0.9)
    header = EventHeader(edge="edge-forget", run="run-forget", seq=1, phase="start", wall_time=time.time(), event=info)
    storage.store_event("edge-forget", header, b"")
    clip = write_synthetic(tmp_path / "clip", n_frames=5, size=(64, 64)).root / "video.mp4"
    files = {"video": ("clip.mp4", clip.read_bytes())}
    assert api(cloud, "POST", "/api/datasets/upload", data={"name": "seen"}, files=files).status_code == 201
    connection = page.get_by_test_id("connection")
    views = [page.get_by_test_id(id) for id in ("edge-row", "camera-row", "event-card", "dataset-row")]
    views.append(page.locator("#stats-strip > div"))

    def expect_shown(shown: bool) -> None:
        for rows in views:
            if shown:
                expect(rows.first).to_be_visible()
            else:
                expect(rows).to_have_count(0)

    sign_in(page, TOKEN)
    expect_shown(True)
    expect(connection).to_have_text("Connected")
    page.get_by_test_id("dataset-label").click()
    expect(page.get_by_test_id("studio")).to_be_visible()
    page.get_by_test_id("token-clear").click()
    expect_shown(False)
    expect(page.get_by_test_id("studio")).to_be_hidden()
    expect(connection).to_have_text("Not signed in")

    sign_in(page, TOKEN)
    expect_shown(True)
    sign_in(page, "not-a-valid-token-at-all-000")
    expect_shown(False)
    expect(connection).to_have_text("Token refused")
    expect(page.get_by_test_id("auth-error")).to_contain_text("Not signed in")
    assert api(cloud, "DELETE", "/api/datasets/seen").status_code == 204


def test_a_spec_json_with_a_field_of_the_wrong_shape_is_refused_naming_it(page: Page, tmp_path: Path) -> None:
    sign_in(page, TOKEN)
    message = page.get_by_test_id("filter-form-message")
    notes = tmp_path / "notes.json"
    notes.write_text("{not json")
    page.get_by_test_id("f-spec").set_input_files(str(notes))
    expect(message).to_contain_text("notes.json is not JSON")
    bad = tmp_path / "spec.json"
    bad.write_text('{"name": "gate", "architecture": "full_frame", "tap": "late", "cameras": "cam-1"}')
    page.get_by_test_id("f-spec").set_input_files(str(bad))
    expect(message).to_have_text(
        'spec.json is not a valid filter spec: "cameras" must be a list of camera names, not "cam-1"'
    )
    expect(message).to_have_class("message error")
    expect(page.get_by_label("Name", exact=True)).to_have_value("")  # the form is left as it was


def test_a_long_filter_name_leaves_the_event_badge_one_line_high(page: Page, cloud: CloudConfig) -> None:
    from cloud.db import make_engine, session_factory
    from cloud.framestore import FrameStore
    from cloud.storage import Storage
    from common.protocol import EventHeader, EventInfo

    storage = Storage(session_factory(make_engine(cloud.db_url)), FrameStore(cloud.data_dir / "frames"))
    name = "a-filter-whose-name-is-long-enough-to-wrap"
    info = EventInfo(id="ev-long", filter=name, camera="cam-long", start_frame=1, start_time=0.1, peak_score=0.9)
    header = EventHeader(edge="edge-long", run="run-long", seq=1, phase="start", wall_time=time.time(), event=info)
    storage.store_event("edge-long", header, b"")  # an edge of its own: (edge, seq) is stored once
    sign_in(page, TOKEN)
    card = page.get_by_test_id("event-card").filter(has_text=name)
    heading = card.locator("h3").bounding_box()
    badge = card.get_by_test_id("event-state").bounding_box()
    assert heading["height"] > 1.8 * badge["height"], (heading, badge)  # the name wraps; the badge does not stretch


def test_the_page_has_an_icon_that_needs_no_request(page: Page) -> None:
    """Browsers that show icons ask for /favicon.ico unless the page names one (headless Chromium asks for none)."""
    icon = page.locator('link[rel="icon"]')
    expect(icon).to_have_attribute("href", re.compile(r"^data:image/svg\+xml,"))
    decoded = """href => new Promise(done => {
        const image = new Image();
        image.onload = () => done(image.naturalWidth);
        image.onerror = () => done(0);
        image.src = href;
    })"""
    assert page.evaluate(decoded, icon.get_attribute("href")) > 0
