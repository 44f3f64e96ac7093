"""The studio's state in the web page (docs/studio.md, "In the web page"), in real headless Chromium against a real
`filterforward cloud serve` process: labels pressed with a token that may not write them, errors of a panel once its
next request succeeds, the open dataset and event kept in the URL across a reload, and the example frames' counts.

Training jobs and revisions are the server's answers as a page route gives them (the trainer itself runs in
test_web_studio.py): what is checked here is what the page makes of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from cloud_server import READ_ONLY, READ_WRITE, CloudServer
from support import signed_in, wait_shown
from test_web_studio import CHROMIUM, clip_fixture, cloud_fixture, dataset_row, open_studio, page_fixture, rest, upload  # noqa: F401 (fixtures)

playwright_api = pytest.importorskip("playwright.sync_api")
Page = playwright_api.Page
Route = playwright_api.Route
Locator = playwright_api.Locator
expect = playwright_api.expect

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")
expect.set_options(timeout=15_000)  # the page polls every 2 s

FORBIDDEN = (
    "{} not saved: this token may not write labels. They are kept in this page and sent once a token with the write "
    "scope is saved (top right)."
)


def stored_labels(cloud: CloudServer, dataset: str, event: str) -> dict:
    return rest(cloud, "GET", f"/api/datasets/{dataset}/labels", params={"event": event}).json()


def job(job_id: int, dataset: str, status: str = "done", **fields: Any) -> dict:
    """A TrainingJobOut of the event "person" as the API answers it (cloud/schemas.py), for filter <dataset>-f."""
    done = status == "done"
    report = {"validation": None, "warnings": [], "examples": None, "uncertain": []}
    return {
        "id": job_id,
        "dataset": dataset,
        "event": "person",
        "filter": f"{dataset}-f",
        "options": {},
        "status": status,
        "trainer": "test-trainer",
        "attempts": 1,
        "progress": {"stage": "done" if done else "training", "fraction": 1.0 if done else 0.25, "message": ""},
        "error": "",
        "result": report if done else None,
        "spec": {"event": "person", "smoothing": {"threshold": 0.5, "k": 2, "n": 3}} if done else None,
        "model_bytes": 1000 if done else 0,
        "deployed": False,
        "created_at": "2024-05-01T12:00:00Z",
        "started_at": "2024-05-01T12:00:01Z",
        "finished_at": "2024-05-01T12:01:00Z" if done else None,
        **fields,
    }


def expect_cleared(message: Locator) -> None:
    expect(message).to_have_text("")
    expect(message).not_to_have_class(re.compile(r"\berror\b"))


def answer_jobs(page: Page, dataset: str, jobs: list[dict]) -> None:
    """GET /api/training-jobs?dataset=<dataset>&event=... answers `jobs`."""
    page.route(
        re.compile(rf"/api/training-jobs\?dataset={dataset}&event=[^&]+$"),
        lambda route: route.fulfill(json=jobs),
    )


def test_a_read_only_token_keeps_its_labels_until_a_token_that_may_write_is_saved(
    browser, cloud: CloudServer, clip: Path
) -> None:
    """Every label PUT of a read-only token got 403, and the page retried it with backoff for ever."""
    upload(cloud, clip, "viewed")
    with signed_in(browser, cloud.url, READ_ONLY, viewport={"width": 1400, "height": 1000}) as page:
        puts: list[str] = []
        page.on("request", lambda request: puts.append(request.url) if request.method == "PUT" else None)
        open_studio(page, "viewed", "person")
        page.keyboard.press("1")
        wait_shown(page, 1)
        page.keyboard.press("0")
        state = page.get_by_test_id("save-state")
        expect(state).to_have_text(FORBIDDEN.format("2 labels"))
        page.wait_for_timeout(3_500)  # a retry would have come after 1 s, then 2 s
        assert len(puts) == 1, puts
        for frame, label in [(0, "label-1"), (1, "label-0")]:  # kept on the page, marked as not saved
            item = page.locator(f'[data-testid="strip-item"][data-frame="{frame}"]')
            expect(item).to_have_class(re.compile(rf"\b{label}\b.*\bunsaved\b"))
        assert stored_labels(cloud, "viewed", "person") == {}

        # Training waits for the labels: refused at once, saying why.
        page.get_by_test_id("train-submit").click()
        expect(page.get_by_test_id("train-message")).to_have_text(
            "Not done: 2 labels not saved: this token may not write labels"
        )
        assert len(puts) == 1, puts

        # A token that may write: the labels go with it.
        page.get_by_label("Bearer token").fill(READ_WRITE)
        page.get_by_test_id("token-save").click()
        expect(state).to_have_text("All labels saved.")
        assert stored_labels(cloud, "viewed", "person") == {"person": {"0": 1, "1": 0}}
        expect(page.locator('[data-testid="strip-item"][data-frame="0"]')).not_to_have_class(re.compile(r"\bunsaved\b"))


def test_a_job_read_error_is_cleared_once_the_job_is_read_again(page: Page, cloud: CloudServer, clip: Path) -> None:
    """ "Could not read job N" stayed under the train form after the next poll of the job had read it."""
    upload(cloud, clip, "polled")
    running = job(9001, "polled", status="running")
    answer_jobs(page, "polled", [running])
    reads: list[int] = []

    def flaky_job(route: Route) -> None:
        reads.append(1)
        if len(reads) == 1:
            route.fulfill(status=503, json={"detail": "the server is restarting"})
        else:
            route.fulfill(json={**running, "progress": {"stage": "training", "fraction": 0.5, "message": ""}})

    page.route(re.compile(r"/api/training-jobs/9001$"), flaky_job)
    page.reload()
    open_studio(page, "polled", "person")
    message = page.get_by_test_id("train-message")
    expect(message).to_have_text("Could not read job 9001: the server is restarting")
    expect(page.get_by_test_id("job-stage")).to_have_text("training 50%")  # read again 4 s later
    expect_cleared(message)


def test_a_failed_job_says_where_it_failed_not_what_it_was_doing(page: Page, cloud: CloudServer, clip: Path) -> None:
    """A failed job showed its trainer's last report as if it went on: "training 40%" and "cross-validating"."""
    upload(cloud, clip, "broken")
    progress = {"stage": "training", "fraction": 0.4, "message": "cross-validating"}
    failed = job(9401, "broken", status="failed", progress=progress, error="the trainer ran out of memory")
    answer_jobs(page, "broken", [failed])
    page.route(re.compile(r"/api/training-jobs/9401$"), lambda route: route.fulfill(json=failed))
    page.reload()
    open_studio(page, "broken", "person")
    expect(page.get_by_test_id("job-status")).to_have_text("failed")
    expect(page.get_by_test_id("job-stage")).to_have_text("failed in training 40%")
    expect(page.get_by_test_id("job-error")).to_have_text("the trainer ran out of memory")
    expect(page.get_by_text("cross-validating")).to_have_count(0)


def test_a_failed_rollback_is_cleared_once_the_revisions_are_read_again(
    page: Page, cloud: CloudServer, clip: Path
) -> None:
    """ "Not rolled back: ..." stayed under the revisions after a deployment had read them again."""
    upload(cloud, clip, "revised")
    deployed = job(9102, "revised", deployed=True)
    answer_jobs(page, "revised", [deployed])
    page.route(re.compile(r"/api/training-jobs/9102$"), lambda route: route.fulfill(json=deployed))  # read at Deploy
    revision = {
        "dataset": "revised",
        "event": "person",
        "validation": None,
        "positives": 10,
        "negatives": 20,
        "created_at": "2024-05-01T12:00:00Z",
        "finished_at": "2024-05-01T12:01:00Z",
    }
    revisions = [{**revision, "job": 9102, "current": True}, {**revision, "job": 9101, "current": False}]
    page.route(re.compile(r"/api/filters/revised-f/revisions$"), lambda route: route.fulfill(json=revisions))
    running = {"name": "revised-f", "spec": {"event": "person"}}
    page.route(re.compile(r"/api/filters/revised-f$"), lambda route: route.fulfill(json=running))
    page.route(
        re.compile(r"/api/training-jobs/9101/deploy$"),
        lambda route: route.fulfill(status=503, json={"detail": "the database is busy: retry"}),
    )
    page.route(re.compile(r"/api/training-jobs/9102/deploy$"), lambda route: route.fulfill(json={"revision": 3}))
    page.reload()
    open_studio(page, "revised", "person")
    page.get_by_test_id("revision-rollback").click()
    message = page.get_by_test_id("revisions-message")
    expect(message).to_have_text("Not rolled back: the database is busy: retry")
    page.get_by_test_id("job-deploy").click()
    expect(page.get_by_test_id("deploy-message")).to_contain_text("Deployed as filter revised-f (revision 3)")
    expect_cleared(message)


def test_the_example_rows_say_how_many_of_the_counted_frames_they_show(
    page: Page, cloud: CloudServer, clip: Path
) -> None:
    """ "Hits (45)" stood beside two thumbnails: a report names one frame of a few runs, not every frame it counts."""
    upload(cloud, clip, "examples")
    examples = {
        "source": "cross-validation",
        "hits": [{"frame": 3, "score": 0.9}, {"frame": 40, "score": 0.8}],
        "false_alarms": [],
        "misses": [{"frame": 60, "score": 0.1}],
        "counts": {"hits": 45, "false_alarms": 0, "misses": 1},
    }
    done = job(9201, "examples")
    done["result"]["examples"] = examples
    answer_jobs(page, "examples", [done])
    page.reload()
    open_studio(page, "examples", "person")
    hits = page.get_by_test_id("examples-hits")
    expect(hits.locator("h4")).to_have_text("Hits (45)")
    expect(hits.locator("button.example")).to_have_count(2)
    expect(hits.get_by_test_id("examples-shown")).to_have_text("2 of 45 shown, one frame per run of consecutive frames")
    for kind in ("false_alarms", "misses"):  # every frame counted is shown (none, or the one)
        expect(page.get_by_test_id(f"examples-{kind}").get_by_test_id("examples-shown")).to_have_count(0)


def test_a_job_whose_labels_changed_says_so_and_asks_before_it_is_deployed(
    page: Page, cloud: CloudServer, clip: Path
) -> None:
    """Labelling on while a job trained left a done job that looked current, and Deploy put a model without the new
    labels on the edges unasked. The job's labels_changed is read again at Deploy: it may turn true after it was
    shown."""
    upload(cloud, clip, "relabelled")
    shown, now = job(9301, "relabelled", labels_changed=False), job(9301, "relabelled", labels_changed=True)
    answer_jobs(page, "relabelled", [shown])
    page.route(re.compile(r"/api/training-jobs/9301$"), lambda route: route.fulfill(json=now))
    page.reload()
    open_studio(page, "relabelled", "person")
    expect(page.get_by_test_id("job-status")).to_have_text("done")
    expect(page.get_by_test_id("job-labels-changed")).to_have_count(0)  # as the list said when the panel opened
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.get_by_test_id("job-deploy").click()
    expect(page.get_by_test_id("deploy-message")).to_have_text("Not deployed. Train a new revision to use them.")
    assert asked == [
        "The event's labels or region changed after this job read them: its model lacks those changes. "
        "Deploy it anyway?"
    ]
    # Deployed anyway, where two edges refuse it: said, not "the edges take it within seconds".
    deployed = {"name": "relabelled-f", "revision": 4, "refused_by": ["edge-a", "edge-b"]}
    page.route(re.compile(r"/api/training-jobs/9301/deploy$"), lambda route: route.fulfill(json=deployed))
    # The filter as the deployment left it: the revisions the page reads next must not say that another model runs.
    revision = {"job": 9301, "current": True, "validation": None, "positives": 3, "negatives": 5,
                "dataset": "relabelled", "event": "person", "finished_at": "2026-12-07T12:00:00Z"}  # fmt: skip
    page.route(re.compile(r"/api/filters/relabelled-f/revisions$"), lambda route: route.fulfill(json=[revision]))
    running = {**deployed, "spec": {"event": "person", "validation": None}}  # as deployWarning reads it
    page.route(re.compile(r"/api/filters/relabelled-f$"), lambda route: route.fulfill(json=running))
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("job-deploy").click()
    expect(page.get_by_test_id("deploy-message")).to_have_text(
        "Deployed as filter relabelled-f (revision 4), but edges edge-a and edge-b refuse it: they run another base "
        "model or input size than it was trained on, and go on with what they ran before."
    )
    expect(page.get_by_test_id("revision-current")).to_have_count(1)  # the revisions were read after it

    answer_jobs(page, "relabelled", [now])  # opened again: the job as it is now
    page.reload()
    open_studio(page, "relabelled", "person")
    expect(page.get_by_test_id("job-labels-changed")).to_have_text(
        "The event's labels or region changed after this job read them: its model lacks those changes. "
        "Train a new revision to use them."
    )


def test_a_reload_or_a_link_opens_the_dataset_and_event_again(page: Page, cloud: CloudServer, clip: Path) -> None:
    """A reload closed the studio; a link could not open it."""
    upload(cloud, clip, "linked")
    page.reload()
    open_studio(page, "linked", "person")
    page.keyboard.press("1")
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    assert page.evaluate("location.hash") == "#studio=linked/person"

    page.reload()
    expect(page.get_by_test_id("studio")).to_be_visible()
    expect(page.get_by_test_id("studio-dataset")).to_have_text("linked")
    expect(page.get_by_test_id("studio-event")).to_have_value("person")
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    expect(page.locator('[data-testid="strip-item"][data-frame="0"]')).to_have_class(re.compile(r"\blabel-1\b"))

    # Another event picked: the hash follows; Close clears it.
    page.get_by_test_id("studio-event").fill("car")
    page.get_by_test_id("studio-event").press("Enter")
    expect(page.get_by_test_id("save-state")).to_have_text("All labels saved.")
    assert page.evaluate("location.hash") == "#studio=linked/car"
    page.get_by_test_id("studio-close").click()
    expect(page.get_by_test_id("studio")).to_be_hidden()
    assert page.evaluate("location.href") == cloud.url + "/"

    # A link given to the open page (the address bar, a click), then one to a dataset that is not here.
    page.goto(f"{cloud.url}/#studio=linked/person")
    expect(page.get_by_test_id("studio")).to_be_visible()
    expect(page.get_by_test_id("studio-event")).to_have_value("person")
    page.get_by_test_id("studio-close").click()
    page.goto("about:blank")
    page.goto(f"{cloud.url}/#studio=gone%20away/person")  # loaded afresh
    status = page.get_by_test_id("datasets-status")
    expect(status).to_have_text("The link names dataset gone away, which is not here (deleted, or never made).")
    expect(page.get_by_test_id("studio")).to_be_hidden()
    expect(dataset_row(page, "linked")).to_be_visible()
    assert page.evaluate("location.hash") == ""


def test_a_link_given_before_the_token_opens_once_the_datasets_are_read(
    browser, cloud: CloudServer, clip: Path
) -> None:
    """The page opened without a token keeps the link until a token reads the datasets."""
    upload(cloud, clip, "later")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{cloud.url}/#studio=later/x")
        expect(page.get_by_test_id("auth-error")).to_contain_text("Enter a bearer token")
        page.get_by_label("Bearer token").fill(READ_WRITE)
        page.get_by_test_id("token-save").click()
        expect(page.get_by_test_id("studio")).to_be_visible()
        expect(page.get_by_test_id("studio-dataset")).to_have_text("later")
        expect(page.get_by_test_id("studio-event")).to_have_value("x")
        assert errors == [], errors
    finally:
        context.close()


def test_a_running_job_can_be_cancelled_from_the_studio(page: Page, cloud: CloudServer, clip: Path) -> None:
    """A job queued by mistake (a huge input size, a slow kind) could not be stopped from the page."""
    upload(cloud, clip, "cancelling")
    running = job(9401, "cancelling", status="running")
    answer_jobs(page, "cancelling", [running])
    page.route(re.compile(r"/api/training-jobs/9401$"), lambda route: route.fulfill(json=running))
    cancelled = {
        **running,
        "status": "failed",
        "error": "cancelled by an operator (POST /api/training-jobs/{id}/cancel)",
    }
    posts: list[str] = []

    def cancel(route: Route) -> None:
        posts.append(route.request.method)
        route.fulfill(json=cancelled)

    page.route(re.compile(r"/api/training-jobs/9401/cancel$"), cancel)
    page.reload()
    open_studio(page, "cancelling", "person")
    expect(page.get_by_test_id("job-status")).to_have_text("running")
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.get_by_test_id("job-cancel").click()
    expect(page.get_by_test_id("job-status")).to_have_text("running")  # asked first, and kept when told no
    assert asked == ["Cancel job 9401? Its trainer stops within seconds."] and posts == []
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("job-cancel").click()
    expect(page.get_by_test_id("job-status")).to_have_text("failed")
    expect(page.get_by_test_id("job-error")).to_have_text(cancelled["error"])
    expect(page.get_by_test_id("job-cancel")).to_have_count(0)
    assert posts == ["POST"]
