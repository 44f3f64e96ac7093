"""Training jobs over REST (docs/studio.md), against a real `filterforward cloud serve` process and real
`filterforward trainer serve --once` processes: a job is queued on an uploaded, labelled synthetic clip, claimed and
trained by a trainer, reported with its estimate and example frames, and deployed through the filter registry; a
trainer that dies loses its job to the next one, a stale trainer is refused, and bad input is refused in one line."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cloud_server import (
    READ_ONLY,
    READ_WRITE,
    TRAINER_TIMEOUT,
    CloudServer,
    finish_trainer,
    job_model,
    run_cloud_on,
    start_trainer,
)
from support import wait_until

from cloud.training import CANCELLED
from filterforward.cli import main
from filterforward.commands.trainer import idle_wait
from models.bundle import write_bundle
from models.datasets import LabelledDataset, open_dataset, write_synthetic
from models.errors import FilterForwardError
from trainer.job import extract_safely

TRAINER_TOKEN = "api-test-trainer-token-345678"
DATASET = "synthetic"
EVENT = "any_object"  # seed 0, 120 frames: positive in 45, two occurrences, so cross-validation runs
LEASE = 4.0  # seconds: short, so a dead trainer's job is taken again within the test
OPTIONS = {"steps": 30}  # the default kind choice (auto) at the clip's size, quickly


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> LabelledDataset:
    return write_synthetic(tmp_path_factory.mktemp("clip"), n_frames=120, size=(160, 96), seed=0)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cloud(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, clip: LabelledDataset
) -> Iterator[CloudServer]:
    """A cloud with a trainer token (train scope only), a short lease and the clip uploaded and labelled."""
    tokens = [
        {"name": "operator", "token": READ_WRITE, "scopes": ["read", "write"]},
        {"name": "viewer", "token": READ_ONLY, "scopes": ["read"]},
        {"name": "trainer", "token": TRAINER_TOKEN, "scopes": ["train"]},
    ]
    settings = {"tokens": tokens, "training": {"lease": LEASE}, "max_upload_bytes": 2**20}  # an ensemble: ~150 kB
    with run_cloud_on(request.param, tmp_path_factory.mktemp(f"cloud-{request.param}"), **settings) as server:
        upload_and_label(server, clip)
        yield server


def upload_and_label(server: CloudServer, clip: LabelledDataset, name: str = DATASET) -> None:
    """The clip through POST /api/datasets/upload, its event's labels and an event labelled positive only."""
    with server.client() as client, (clip.root / "video.mp4").open("rb") as video:
        answer = client.post("/api/datasets/upload", data={"name": name}, files={"video": ("clip.mp4", video)})
        assert answer.status_code == 201, answer.text
        assert answer.json()["frames"] == clip.n_frames
        labels = [{"frame": i, "value": int(v)} for i, v in enumerate(clip.labels[EVENT])]
        answer = client.put(f"/api/datasets/{name}/labels", json={"event": EVENT, "labels": labels})
        assert answer.status_code == 200, answer.text
        only_positive = [{"frame": i, "value": 1} for i in range(10)]
        answer = client.put(f"/api/datasets/{name}/labels", json={"event": "always", "labels": only_positive})
        assert answer.status_code == 200, answer.text


def report_of(job: dict[str, Any], **fields: Any) -> str:
    """A trainer's report for a job a test finishes by hand (the shape trainer.report writes)."""
    examples = {"source": "training frames", "hits": [{"frame": 3, "score": 0.9}], "false_alarms": [], "misses": []}
    report = {
        "filter": job["filter"], "event": job["event"], "architecture": "full_frame", "tap": "late",
        "input_size": [160, 96], "frames": [0, 120], "positives": 45, "negatives": 75, "steps": 30,
        "validation": None, "training_f1": 1.0, "warnings": [], "candidates": [], "seconds": 1.0,
        "examples": {**examples, "counts": {"hits": 1, "false_alarms": 0, "misses": 0}}, "uncertain": [],
        **fields,
    }  # fmt: skip
    return json.dumps(report)


def post_result(cloud: CloudServer, make_filter: Any, job: dict[str, Any], trainer: str, report: str) -> httpx.Response:
    """The result of a job `trainer` holds: a real filter bundle for the job's filter and event, and `report`."""
    spec, onnx = make_filter("full_frame", "late", (160, 96), name=job["filter"], event=job["event"])
    form = {"trainer": trainer, "spec": spec.model_dump_json(), "report": report}
    with cloud.client(TRAINER_TOKEN) as client:
        return client.post(f"/api/training-jobs/{job['id']}/result", data=form, files={"model": ("model.onnx", onnx)})


def queue_job(cloud: CloudServer, filter_name: str, **fields: Any) -> dict[str, Any]:
    body = {"dataset": DATASET, "event": EVENT, "filter": filter_name, "options": OPTIONS, **fields}
    with cloud.client() as client:
        answer = client.post("/api/training-jobs", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def get_job(cloud: CloudServer, job_id: int) -> dict[str, Any]:
    with cloud.client(READ_ONLY) as client:
        answer = client.get(f"/api/training-jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def claim(cloud: CloudServer, name: str) -> httpx.Response:
    with cloud.client(TRAINER_TOKEN) as client:
        return client.post("/api/training-jobs/claim", json={"trainer": name})


def test_a_trainer_trains_a_queued_job_and_its_bundle_is_deployed(
    cloud: CloudServer, clip: LabelledDataset, base_model: Path, tmp_path: Path
) -> None:
    job = queue_job(cloud, "anything-here")
    assert (job["status"], job["attempts"], job["progress"], job["result"]) == ("queued", 0, None, None)
    assert job["labels_changed"] is None  # known once a trainer says what it learned from
    assert job["options"]["steps"] == 30 and job["options"]["arch"] is None

    process = start_trainer(cloud, TRAINER_TOKEN, base_model, tmp_path, "trainer-a")
    stages = set()
    while process.poll() is None:  # what the page would show while it trains
        progress = get_job(cloud, job["id"])["progress"]
        stages.add(progress and progress["stage"])
        time.sleep(0.05)
    finish_trainer(process, tmp_path, "trainer-a")
    assert stages & {"download", "features", "training", "exporting"}

    done = get_job(cloud, job["id"])
    assert (done["status"], done["attempts"], done["trainer"], done["error"]) == ("done", 1, "trainer-a", "")
    assert done["progress"]["fraction"] == 1.0 and done["model_bytes"] > 0
    spec, report = done["spec"], done["result"]
    assert (spec["name"], spec["event"], spec["input_size"]) == ("anything-here", EVENT, [160, 96])
    assert report["frames"] == labelled_span(clip)  # every labelled frame, not the first half
    assert report["positives"] + report["negatives"] == sum(value != -1 for value in clip.labels[EVENT])
    assert report["validation"] == spec["validation"] and report["validation"] is not None
    assert done["labels_changed"] is False  # the trainer's digest of the archive it read is the cloud's of its rows
    estimate = report["validation"]
    assert estimate["f1_min"] <= estimate["event_f1"] <= estimate["f1_max"]
    assert {(c["architecture"], c["tap"]) for c in report["candidates"]} == {
        ("full_frame", "mid"),
        ("full_frame", "late"),
    }
    assert report["warnings"] == list(estimate["warnings"])
    examples = report["examples"]
    assert examples["source"] == "cross-validation"
    assert examples["counts"]["hits"] + examples["counts"]["misses"] > 0
    labels = clip.labels[EVENT]
    assert all(labels[e["frame"]] == 1 for e in examples["hits"] + examples["misses"])
    assert all(labels[e["frame"]] == 0 for e in examples["false_alarms"])

    with cloud.client() as client:
        deployed = client.post(f"/api/training-jobs/{job['id']}/deploy")
        assert deployed.status_code == 200, deployed.text
        listed = {f["name"]: f for f in client.get("/api/filters").json()}
        assert listed["anything-here"]["spec"] == {**spec, "version": 1}
        assert client.get("/api/filters/anything-here/model").content == job_model(cloud, job["id"])
        narrowed = json.dumps({**spec, "cameras": ["cam-1"]})  # the operator points it at one camera
        assert client.put("/api/filters/anything-here", data={"spec": narrowed}).status_code == 200
        again = client.post(f"/api/training-jobs/{job['id']}/deploy")  # a new revision, on the camera chosen
        assert again.status_code == 200, again.text
        assert (again.json()["spec"]["version"], again.json()["spec"]["cameras"]) == (3, ["cam-1"])
        assert again.json()["revision"] > deployed.json()["revision"]
    assert get_job(cloud, job["id"])["deployed"] is True


def labelled_span(clip: LabelledDataset) -> list[int]:
    labelled = [i for i, value in enumerate(clip.labels[EVENT]) if value != -1]
    return [labelled[0], labelled[-1] + 1]


def test_a_trainer_that_dies_mid_job_loses_it_to_the_next(
    cloud: CloudServer, clip: LabelledDataset, base_model: Path, tmp_path: Path
) -> None:
    job = queue_job(cloud, "survivor")
    first = start_trainer(cloud, TRAINER_TOKEN, base_model, tmp_path, "trainer-dies")

    def training() -> bool:
        progress = get_job(cloud, job["id"])["progress"] or {}
        return progress.get("stage") in ("features", "training") or first.poll() is not None

    wait_until(training, "the first trainer to start training", timeout=TRAINER_TIMEOUT)
    first.kill()
    first.wait()
    time.sleep(LEASE + 0.5)  # its last progress report renewed the lease for this long
    running = get_job(cloud, job["id"])
    assert (running["status"], running["attempts"], running["trainer"]) == ("running", 1, "trainer-dies")

    second = start_trainer(cloud, TRAINER_TOKEN, base_model, tmp_path, "trainer-next")
    finish_trainer(second, tmp_path, "trainer-next")
    done = get_job(cloud, job["id"])
    assert (done["status"], done["attempts"], done["trainer"]) == ("done", 2, "trainer-next")
    assert done["result"]["frames"] == labelled_span(clip) and done["spec"]["name"] == "survivor"
    with cloud.client() as client:
        assert client.post(f"/api/training-jobs/{job['id']}/deploy").status_code == 200
        assert client.get("/api/filters/survivor").json()["spec"]["validation"] == done["spec"]["validation"]


def test_sigterm_stops_a_training_trainer_at_once_and_its_job_goes_back(
    cloud: CloudServer, base_model: Path, tmp_path: Path
) -> None:
    """SIGTERM mid-training unwound into the wait for the fits running on other threads: the trainer trained on,
    minutes, and its progress thread kept renewing the job's lease (docker stop ended it with SIGKILL)."""
    job = queue_job(cloud, "stopped-mid-job", options={"steps": 20_000})  # longer than this test waits
    trainer = start_trainer(cloud, TRAINER_TOKEN, base_model, tmp_path, "trainer-stopped")

    def training() -> bool:
        return (get_job(cloud, job["id"])["progress"] or {}).get("stage") == "training" or trainer.poll() is not None

    wait_until(training, "the trainer to start training", timeout=TRAINER_TIMEOUT)
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=30) == 0, (tmp_path / "trainer-stopped.log").read_text()
    assert not list((tmp_path / "trainer-stopped").glob("job-*"))  # its work folder was removed
    time.sleep(LEASE + 0.5)  # no report renews the lease now
    assert claim(cloud, "trainer-after").json()["id"] == job["id"]
    with cloud.client(TRAINER_TOKEN) as client:  # the next trainer gives it up: the test is done with it
        failed = {"trainer": "trainer-after", "message": "done with this test"}
        assert client.post(f"/api/training-jobs/{job['id']}/failed", json=failed).status_code == 200


def test_a_cancelled_job_stops_its_trainer_mid_training(cloud: CloudServer, base_model: Path, tmp_path: Path) -> None:
    """The trainer learned of the cancel at its next report but stopped only at its stage's end: the fits on its
    threads trained on (here for far longer than this test waits) while the job showed cancelled."""
    job = queue_job(cloud, "cancelled-mid-job", options={"steps": 100_000})
    trainer = start_trainer(cloud, TRAINER_TOKEN, base_model, tmp_path, "trainer-cancelled")

    def training() -> bool:
        return (get_job(cloud, job["id"])["progress"] or {}).get("stage") == "training" or trainer.poll() is not None

    wait_until(training, "the trainer to start training", timeout=TRAINER_TIMEOUT)
    with cloud.client() as client:
        assert client.post(f"/api/training-jobs/{job['id']}/cancel").status_code == 200
    try:
        assert trainer.wait(timeout=120) == 1  # --once: the job was not done
    finally:
        trainer.kill()
    log = (tmp_path / "trainer-cancelled.log").read_text()
    assert f"training job {job['id']}: " in log and "stop working on it" in log, log
    assert "Traceback" not in log, log
    assert not list((tmp_path / "trainer-cancelled").glob("job-*"))
    assert get_job(cloud, job["id"])["error"] == CANCELLED


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--work", "/proc/forbidden"], "--work /proc/forbidden cannot be written"),
        (["--threads", "0"], "--threads must be at least 1, got 0"),
        (["--health-port", "80000"], "--health-port must be a port from 1 to 65535, got 80000"),
        (["--base-model", "{clip}/labels.csv"], "labels.csv does not load as an ONNX model"),
    ],
)
def test_a_trainer_that_could_not_train_is_refused_before_it_claims_a_job(
    option: list[str],
    expected: str,
    clip: LabelledDataset,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each of these failed every queued job in turn, for good, with a reason that blamed the job; the cloud here
    does not answer, so a claim would end the run with another error."""
    monkeypatch.setenv("FF_TRAINER_TOKEN", TRAINER_TOKEN)
    option = [value.format(clip=clip.root) for value in option]
    argv = ["trainer", "serve", "--cloud", "http://127.0.0.1:9", "--once", "--work", str(tmp_path), *option]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("filterforward trainer: error: ") and expected in err and err.count("\n") == 1, err


def test_stale_trainers_are_refused_and_a_job_fails_after_its_trainers_die(
    cloud: CloudServer, make_filter: Any
) -> None:
    job = queue_job(cloud, "stale-one")
    with cloud.client() as client:
        refused = client.post(f"/api/training-jobs/{job['id']}/deploy")
        assert refused.status_code == 409 and "queued, not done" in refused.json()["detail"]

    first = claim(cloud, "trainer-1")
    assert first.status_code == 200, first.text
    assert (first.json()["id"], first.json()["attempts"], first.json()["lease_seconds"]) == (job["id"], 1, LEASE)
    assert first.json()["archive_url"] == f"/api/datasets/{DATASET}/archive.tar"
    assert claim(cloud, "trainer-2").status_code == 204  # nothing else waits while trainer-1 holds it
    progress = {"trainer": "trainer-1", "stage": "training", "fraction": 0.5, "message": "fold 1"}
    with cloud.client(TRAINER_TOKEN) as client:
        assert client.post(f"/api/training-jobs/{job['id']}/progress", json=progress).status_code == 200
    time.sleep(LEASE + 0.5)  # trainer-1 falls silent

    second = claim(cloud, "trainer-2")
    assert (second.json()["id"], second.json()["attempts"]) == (job["id"], 2)
    spec, onnx = make_filter("full_frame", "late", (160, 96), name="stale-one", event=EVENT)
    with cloud.client(TRAINER_TOKEN) as client:
        stale = client.post(f"/api/training-jobs/{job['id']}/progress", json=progress)
        assert stale.status_code == 409 and "not held by trainer 'trainer-1'" in stale.json()["detail"]
        files = {"model": ("model.onnx", onnx)}
        form = {"trainer": "trainer-1", "spec": spec.model_dump_json(), "report": "{}"}
        assert client.post(f"/api/training-jobs/{job['id']}/result", data=form, files=files).status_code == 409
        failed = {"trainer": "trainer-1", "message": "gave up"}
        assert client.post(f"/api/training-jobs/{job['id']}/failed", json=failed).status_code == 409
        renewed = client.post(f"/api/training-jobs/{job['id']}/progress", json={**progress, "trainer": "trainer-2"})
        assert renewed.status_code == 200, renewed.text
        old_claim = {**progress, "trainer": "trainer-2", "attempt": 1}
        assert client.post(f"/api/training-jobs/{job['id']}/progress", json=old_claim).status_code == 409
        wrong = spec.model_copy(update={"name": "another-filter"}).model_dump_json()
        answer = client.post(
            f"/api/training-jobs/{job['id']}/result", data={**form, "trainer": "trainer-2", "spec": wrong}, files=files
        )
        assert answer.status_code == 422 and "upload the bundle trained for this job" in answer.json()["detail"]
    time.sleep(LEASE + 0.5)

    assert claim(cloud, "trainer-3").json()["attempts"] == 3
    time.sleep(LEASE + 0.5)  # the third trainer dies too: the job fails rather than be taken a fourth time
    assert claim(cloud, "trainer-4").status_code == 204
    failed_job = get_job(cloud, job["id"])
    assert failed_job["status"] == "failed" and "died" in failed_job["error"] and "trainer-3" in failed_job["error"]


def test_a_report_about_other_things_than_its_job_is_refused(cloud: CloudServer, make_filter: Any) -> None:
    job = queue_job(cloud, "reported")
    assert claim(cloud, "trainer-r").json()["id"] == job["id"]
    no_hits = {"source": "training frames", "hits": [], "false_alarms": [], "misses": []}
    cases = [
        (report_of(job, event="always"), "the report is for filter 'reported' and event 'always', but job"),
        (report_of(job, filter="another"), "the report is for filter 'another'"),
        (report_of(job, uncertain=[{"frame": 999, "score": 0.5}]), "names frame 999, which dataset 'synthetic' does"),
        (
            report_of(job, examples={**no_hits, "misses": [{"frame": 120, "score": 0.1}], "counts": {"misses": 1}}),
            "names frame 120",
        ),
    ]
    for report, detail in cases:
        answer = post_result(cloud, make_filter, job, "trainer-r", report)
        assert answer.status_code == 422 and detail in answer.json()["detail"], answer.text
    assert get_job(cloud, job["id"])["status"] == "running"  # nothing stored: the trainer may send it right
    answer = post_result(cloud, make_filter, job, "trainer-r", report_of(job, uncertain=[{"frame": 119, "score": 0.5}]))
    assert answer.status_code == 200, answer.text
    assert get_job(cloud, job["id"])["result"]["uncertain"] == []  # frame 119 is labelled: not one to label next


def test_deleting_a_dataset_keeps_its_deployed_jobs_and_fails_waiting_ones(
    cloud: CloudServer, clip: LabelledDataset, make_filter: Any
) -> None:
    """A deployed job is a revision of its filter, to roll back to, whether or not its frames are still kept."""
    upload_and_label(cloud, clip, "doomed")
    deployed = queue_job(cloud, "doomed-made", dataset="doomed")
    assert claim(cloud, "trainer-d").json()["id"] == deployed["id"]
    assert post_result(cloud, make_filter, deployed, "trainer-d", report_of(deployed)).status_code == 200
    running, queued = queue_job(cloud, "doomed-made", dataset="doomed"), queue_job(cloud, "doomed-2", dataset="doomed")
    assert claim(cloud, "trainer-e").json()["id"] == running["id"]
    with cloud.client() as client:
        assert client.post(f"/api/training-jobs/{deployed['id']}/deploy").status_code == 200
        assert client.delete("/api/datasets/doomed").status_code == 204

        kept = get_job(cloud, deployed["id"])
        assert (kept["status"], kept["dataset"], kept["deployed"]) == ("done", None, True)
        [revision] = client.get("/api/filters/doomed-made/revisions").json()
        assert (revision["job"], revision["dataset"], revision["current"]) == (deployed["id"], None, True)
        for job in (running, queued):
            failed = get_job(cloud, job["id"])
            assert (failed["status"], failed["error"], failed["dataset"]) == (
                "failed",
                "its dataset 'doomed' was deleted",
                None,
            )
        progress = {"trainer": "trainer-e", "stage": "training", "fraction": 0.5}
        with cloud.client(TRAINER_TOKEN) as trainer:  # the trainer that held one learns to stop
            stopped = trainer.post(f"/api/training-jobs/{running['id']}/progress", json=progress)
        assert stopped.status_code == 409 and "it is failed" in stopped.json()["detail"]

        assert client.post(f"/api/training-jobs/{deployed['id']}/deploy").status_code == 200  # still rolls back
        interval = {"edge": "e", "camera": "c", "start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}
        gone = client.post("/api/filters/doomed-made/missed", json=interval)
        assert gone.status_code == 409 and "was trained on has been deleted" in gone.json()["detail"], gone.text
        unknown = client.post("/api/filters/nobody-at-all/missed", json=interval)
        assert unknown.status_code == 404 and "no filter named 'nobody-at-all'" in unknown.json()["detail"]
    upload_and_label(cloud, clip, "doomed")  # the name again: a new dataset, with none of the old jobs
    with cloud.client() as client:
        assert client.get("/api/training-jobs", params={"dataset": "doomed"}).json() == []


def test_a_done_job_says_when_the_labels_it_learned_from_changed(
    cloud: CloudServer, clip: LabelledDataset, make_filter: Any, tmp_path: Path
) -> None:
    """Labelling on while a job trains (the studio's usual flow) left a done job that looked current; now the job
    says that its model lacks the changes, until they are undone. The digest a trainer reports is the one of the
    archive it downloads (a region included), which the cloud's, from its rows, must match."""
    upload_and_label(cloud, clip, "relabelled")
    triangle = [[0.1, 0.2], [0.9, 0.2], [0.5, 0.8]]
    with cloud.client() as client:
        assert client.put(f"/api/datasets/relabelled/regions/{EVENT}", json={"polygon": triangle}).status_code == 200
        archive = tmp_path / "relabelled.tar"
        archive.write_bytes(client.get("/api/datasets/relabelled/archive.tar").content)
    extract_safely(archive, tmp_path / "dataset")
    job = queue_job(cloud, "relabelled-made", dataset="relabelled")
    assert claim(cloud, "trainer-l").json()["id"] == job["id"]
    digest = open_dataset(tmp_path / "dataset").labels_digest(EVENT)
    assert post_result(cloud, make_filter, job, "trainer-l", report_of(job, labels_digest=digest)).status_code == 200

    def changed() -> bool | None:
        with cloud.client(READ_ONLY) as client:
            listed = {j["id"]: j for j in client.get("/api/training-jobs", params={"dataset": "relabelled"}).json()}
        assert listed[job["id"]]["labels_changed"] == get_job(cloud, job["id"])["labels_changed"]
        return listed[job["id"]]["labels_changed"]

    assert changed() is False
    value = int(clip.labels[EVENT][5])
    with cloud.client() as client:
        for labels, region, expected in (
            ([{"frame": 5, "value": 1 - value}], triangle, True),  # a label flipped
            ([{"frame": 5, "value": value}], triangle, False),  # and back
            ([{"frame": 5, "value": -1}], triangle, True),  # made uncertain: no longer trained on
            ([{"frame": 5, "value": value}], [[0.1, 0.2], [0.9, 0.2], [0.5, 0.9]], True),  # the region redrawn
        ):
            body = {"event": EVENT, "labels": labels}
            assert client.put("/api/datasets/relabelled/labels", json=body).status_code == 200
            assert client.put(f"/api/datasets/relabelled/regions/{EVENT}", json={"polygon": region}).status_code == 200
            assert changed() is expected, (labels, region)


def test_jobs_are_listed_newest_first_a_page_at_a_time(cloud: CloudServer, clip: LabelledDataset) -> None:
    """Every job was listed at once (1,500 jobs: 576 kB), ordered by creation time, which jobs queued at once share."""
    upload_and_label(cloud, clip, "paged")
    with ThreadPoolExecutor(4) as pool:
        ids = sorted(pool.map(lambda n: queue_job(cloud, f"paged-{n}", dataset="paged")["id"], range(4)))
    with cloud.client(READ_ONLY) as client:

        def listed(**params: Any) -> list[int]:
            answer = client.get("/api/training-jobs", params={"dataset": "paged", **params})
            assert answer.status_code == 200, answer.text
            return [job["id"] for job in answer.json()]

        assert listed() == ids[::-1]
        assert listed(limit=3) == ids[:0:-1] and listed(limit=3, before=ids[1]) == ids[:1]
        assert listed(event=EVENT, status="queued") == ids[::-1] and listed(event="always") == []
        for params, detail in (({"limit": 0}, "query.limit"), ({"before": "x"}, "query.before")):
            answer = client.get("/api/training-jobs", params=params)
            assert answer.status_code == 422 and detail in answer.json()["detail"], answer.text
    with cloud.client() as client:  # their jobs fail: the tests after this one claim theirs
        assert client.delete("/api/datasets/paged").status_code == 204


def test_the_job_deployed_last_is_the_one_the_filter_runs(
    cloud: CloudServer, clip: LabelledDataset, make_filter: Any
) -> None:
    """After a rollback the filter runs the older job: feedback goes to that job's dataset (it went to the newest
    deployed job's), and that job alone is current, though the newer one's model is the same bytes."""
    jobs = []
    for dataset, trainer in (("kept-data", "trainer-r1"), ("newer-data", "trainer-r2")):
        upload_and_label(cloud, clip, dataset)
        job = queue_job(cloud, "rolled", dataset=dataset)
        assert claim(cloud, trainer).json()["id"] == job["id"]
        assert post_result(cloud, make_filter, job, trainer, report_of(job)).status_code == 200
        jobs.append(job)
    first, second = jobs
    assert job_model(cloud, first["id"]) == job_model(cloud, second["id"])
    with cloud.client() as client:
        for job in (first, second, first):  # deployed, a new revision, rolled back
            assert client.post(f"/api/training-jobs/{job['id']}/deploy").status_code == 200
        revisions = client.get("/api/filters/rolled/revisions").json()
        assert [(r["job"], r["current"]) for r in revisions] == [(second["id"], False), (first["id"], True)]
        assert client.delete("/api/datasets/newer-data").status_code == 204  # the dataset the filter no longer runs
        interval = {"edge": "e", "camera": "c", "start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}
        answer = client.post("/api/filters/rolled/missed", json=interval)
    # Taken for kept-data (the interval holds no frame); before, refused: the newest deployed job's dataset is gone.
    assert answer.status_code == 409 and "the cloud holds no frame of camera 'c'" in answer.json()["detail"]


def test_deploys_at_once_of_a_new_filter_all_succeed_and_the_last_marked_is_what_runs(
    cloud: CloudServer, make_filter: Any
) -> None:
    """Three of four deploys of a new filter at once answered "already exists"; deploys of two jobs at once could
    leave the last-deployed mark on another job than the one the filter ran, so no revision was current."""
    jobs = [queue_job(cloud, "at-once") for _ in range(2)]
    for job, trainer in zip(jobs, ("trainer-d1", "trainer-d2"), strict=True):
        assert claim(cloud, trainer).json()["id"] == job["id"]
        assert post_result(cloud, make_filter, job, trainer, report_of(job)).status_code == 200

    def deploy(job_id: int) -> int:
        with cloud.client() as client:
            return client.post(f"/api/training-jobs/{job_id}/deploy").status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(deploy, [jobs[0]["id"]] * 4)) == [200] * 4
        assert list(pool.map(deploy, [job["id"] for job in jobs] * 4)) == [200] * 8
    with cloud.client() as client:
        revisions = client.get("/api/filters/at-once/revisions").json()
    assert sum(revision["current"] for revision in revisions) == 1, revisions


def test_a_queued_or_running_job_can_be_cancelled(cloud: CloudServer) -> None:
    """A job queued by mistake (a 4096x4096 input, the slow discrete kind) could only be got rid of by claiming and
    failing it by hand, or by deleting its dataset."""
    queued, running = queue_job(cloud, "cancel-queued"), queue_job(cloud, "cancel-running")
    with cloud.client(READ_ONLY) as viewer:
        assert viewer.post(f"/api/training-jobs/{queued['id']}/cancel").status_code == 403
    with cloud.client() as client:
        answer = client.post(f"/api/training-jobs/{queued['id']}/cancel")
        assert answer.status_code == 200, answer.text
        assert (answer.json()["status"], answer.json()["error"]) == ("failed", CANCELLED)
        assert claim(cloud, "trainer-cancel").json()["id"] == running["id"]  # the cancelled one is not handed out
        assert client.post(f"/api/training-jobs/{running['id']}/cancel").json()["status"] == "failed"
        again = client.post(f"/api/training-jobs/{running['id']}/cancel")
        assert again.status_code == 409
        assert again.json()["detail"] == (
            f"training job {running['id']} is failed: only a queued or running job can be cancelled"
        )
    progress = {"trainer": "trainer-cancel", "stage": "training", "fraction": 0.5, "message": ""}
    with cloud.client(TRAINER_TOKEN) as trainer:  # its trainer is told to stop at its next report
        refused = trainer.post(f"/api/training-jobs/{running['id']}/progress", json=progress)
        assert refused.status_code == 409 and "stop working on it" in refused.json()["detail"]


def test_a_nul_character_in_a_reason_is_refused_not_a_500(cloud: CloudServer) -> None:
    """PostgreSQL's text holds no NUL: a failure reason with one (\\u0000 in its JSON) failed in the driver."""
    job = queue_job(cloud, "nul-reason")
    assert claim(cloud, "trainer-nul").json()["id"] == job["id"]
    with cloud.client(TRAINER_TOKEN) as client:
        failed = {"trainer": "trainer-nul", "message": "read frame\u0000 failed"}
        answer = client.post(f"/api/training-jobs/{job['id']}/failed", json=failed)
        assert answer.status_code == 422
        assert answer.json()["detail"] == "the JSON body holds a NUL character (\\u0000): send text without it"
        failed["message"] = "a backslash \\u0000 is text"  # an escaped backslash, then u0000: no NUL
        assert client.post(f"/api/training-jobs/{job['id']}/failed", json=failed).status_code == 200
    with cloud.client() as client:
        assert client.get(f"/api/training-jobs/{job['id']}").json()["error"] == "a backslash \\u0000 is text"


def test_a_cloud_restart_gives_running_jobs_a_lease_to_report_again(cloud: CloudServer) -> None:
    """A cloud down for longer than the lease handed a healthy trainer's job to the next trainer at its start."""
    job = queue_job(cloud, "through-restart")
    assert claim(cloud, "trainer-up").json()["id"] == job["id"]
    cloud.stop()
    time.sleep(LEASE + 0.5)  # trainer-up could not report meanwhile
    cloud.start()
    assert claim(cloud, "trainer-next").status_code == 204
    progress = {"trainer": "trainer-up", "stage": "training", "fraction": 0.5, "message": ""}
    with cloud.client(TRAINER_TOKEN) as client:
        assert client.post(f"/api/training-jobs/{job['id']}/progress", json=progress).status_code == 200
        failed = {"trainer": "trainer-up", "message": "done with this test"}
        assert client.post(f"/api/training-jobs/{job['id']}/failed", json=failed).status_code == 200


def test_a_trained_result_waits_for_a_cloud_that_restarts_as_it_is_posted(
    cloud: CloudServer, make_filter: Any, tmp_path: Path
) -> None:
    from trainer.client import Cloud
    from trainer.job import _post_result

    job = queue_job(cloud, "posted-late")
    assert claim(cloud, "trainer-late").json()["id"] == job["id"]
    spec, onnx = make_filter("full_frame", "late", (160, 96), name=job["filter"], event=job["event"])
    bundle = write_bundle(tmp_path / "bundle", spec, onnx)
    cloud.stop()
    back = threading.Timer(3.0, cloud.start)
    back.start()
    try:
        _post_result(Cloud(cloud.url, TRAINER_TOKEN), job["id"], "trainer-late", 1, bundle, json.loads(report_of(job)))
    finally:
        back.join()
    assert get_job(cloud, job["id"])["status"] == "done"


def test_a_job_that_fails_right_after_entering_a_stage_is_shown_failed_in_that_stage(
    cloud: CloudServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The progress thread posts a new stage when it gets to it: a job that failed at once in cross-validation (too
    few labels) read "failed in features 5%" in the studio. Its messages were every log line of the training, such
    as what the base model was pruned to."""
    from trainer.client import Cloud
    from trainer.job import Reporter

    job = queue_job(cloud, "failed-at-once")
    assert claim(cloud, "trainer-quick").json()["id"] == job["id"]
    caplog.set_level(logging.INFO, logger="models")  # as the trainer logs
    with Reporter(Cloud(cloud.url, TRAINER_TOKEN), job["id"], "trainer-quick", 1, interval=60) as reporter:
        reporter.update("features", 0.0, "base-DNN features")
        reporter.update("training", 0.0, "cross-validating")
        logging.getLogger("models.training").info("cross-validation fold 1 of 3: 20 held-out frames")
        logging.getLogger("models.base_runtime").info("base model x.onnx pruned to late")  # no progress to a person
    # the training fails here
    progress = get_job(cloud, job["id"])["progress"]
    assert (progress["stage"], progress["message"]) == ("training", "cross-validation fold 1 of 3: 20 held-out frames")
    with cloud.client(TRAINER_TOKEN) as client:
        failed = {"trainer": "trainer-quick", "message": "done with this test"}
        assert client.post(f"/api/training-jobs/{job['id']}/failed", json=failed).status_code == 200


def test_a_job_whose_labels_are_of_one_kind_says_to_label_the_other(tmp_path: Path) -> None:
    """It failed with the CLI's advice, "pick a training range with both": a job trains on every labelled frame."""
    from trainer.job import job_config

    dataset = write_synthetic(tmp_path, n_frames=30, size=(160, 96), seed=0)
    dataset.labels[EVENT] = np.where(dataset.labels[EVENT] == 1, 1, -1)  # only the frames with the object labelled
    job = {"event": EVENT, "filter": "one-kind", "options": {}}
    with pytest.raises(FilterForwardError) as refused:
        job_config(job, dataset, threads=1)
    positive = int((dataset.labels[EVENT] == 1).sum())
    assert str(refused.value) == (
        f"'{EVENT}' has {positive} frame(s) labelled with it and 0 without it: label frames of both kinds, then train "
        "again"
    )


def test_trainers_claiming_at_once_never_share_a_job(cloud: CloudServer) -> None:
    jobs = {queue_job(cloud, f"race-{n}")["id"] for n in range(3)}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: claim(cloud, f"racer-{n}"), range(8)))
    claimed = [answer.json() for answer in answers if answer.status_code == 200]
    assert sorted(answer.status_code for answer in answers) == [200] * 3 + [204] * 5
    assert {job["id"] for job in claimed} == jobs and all(job["attempts"] == 1 for job in claimed)
    for job in claimed:  # each holder reports on its own job, and gives it up
        assert get_job(cloud, job["id"])["trainer"] == job["trainer"]
        with cloud.client(TRAINER_TOKEN) as client:
            failed = {"trainer": job["trainer"], "message": "a race test\nsecond line", "attempt": 1}
            assert client.post(f"/api/training-jobs/{job['id']}/failed", json=failed).status_code == 200
        assert get_job(cloud, job["id"])["error"] == "a race test"
    with cloud.client() as client:  # said "deploy it once it says done", which a failed job never will
        refused = client.post(f"/api/training-jobs/{claimed[0]['id']}/deploy")
    assert refused.status_code == 409 and refused.json()["detail"] == (
        f"training job {claimed[0]['id']} failed (a race test), so it has no filter to deploy: deploy a job that is "
        "done, or queue a new one (POST /api/training-jobs)"
    )


def test_bad_jobs_are_refused_in_one_line(cloud: CloudServer) -> None:
    cases = [
        ({"dataset": "nowhere"}, 404, "no dataset named 'nowhere'"),
        ({"event": "never_labelled"}, 422, "has 0 positive and 0 negative labels"),
        ({"event": "always"}, 422, "has 10 positive and 0 negative labels"),
        ({"filter": "Bad Name"}, 422, "body.filter: String should match pattern"),
        ({"options": {"optimizer": "sgd"}}, 422, "body.options.optimizer: Input should be 'adam'"),
        ({"options": {"input_size": [100, 96]}}, 422, "multiple of 32"),
        ({"options": {"epochs": 3}}, 422, "epochs"),
        ({"options": {"steps": True}}, 422, "body.options.steps: Input should be a number, not true or false"),
    ]
    with cloud.client() as client:
        for fields, status, detail in cases:
            body = {"dataset": DATASET, "event": EVENT, "filter": "refused", **fields}
            answer = client.post("/api/training-jobs", json=body)
            assert answer.status_code == status, (fields, answer.text)
            assert detail in answer.json()["detail"] and "\n" not in answer.json()["detail"], fields
        assert client.post("/api/training-jobs/claim", json={"trainer": "operator"}).status_code == 403
        assert client.get("/api/training-jobs/999").status_code == 404
        assert client.post("/api/training-jobs/999/deploy").status_code == 404
        assert all(job["filter"] != "refused" for job in client.get("/api/training-jobs").json())
    with cloud.client(TRAINER_TOKEN) as client:
        job = {"dataset": DATASET, "event": EVENT, "filter": "x"}
        assert client.post("/api/training-jobs", json=job).status_code == 403  # trainers do not queue jobs
        progress = {"trainer": "t", "stage": "training", "fraction": 0}
        assert client.post("/api/training-jobs/999/progress", json=progress).status_code == 404


def test_a_job_trains_on_two_processes_with_a_compressed_optimizer(
    cloud: CloudServer, clip: LabelledDataset, base_model: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`--nproc` and the compressed optimizers work through the trainer as in the CLI: torchrun, two gloo workers,
    1-bit Adam, a single kind (the default's cross-validation runs in one process)."""
    if "postgresql" in request.node.callspec.id:
        pytest.skip("the database plays no part in how the trainer trains: SQLite covers it")
    options = {"arch": "full_frame", "nproc": 2, "optimizer": "onebit_adam", "steps": 30}
    job = queue_job(cloud, "two-workers", options=options)
    process = start_trainer(cloud, TRAINER_TOKEN, base_model, tmp_path, "trainer-2p")
    messages = set()
    while process.poll() is None:  # the page's view of it: the training stage names the processes
        messages.add((get_job(cloud, job["id"])["progress"] or {}).get("message"))
        time.sleep(0.05)
    finish_trainer(process, tmp_path, "trainer-2p")
    done = get_job(cloud, job["id"])
    assert done["status"] == "done", done["error"]
    assert (done["spec"]["architecture"], done["result"]["steps"]) == ("full_frame", 30)
    assert "training on 2 processes" in messages, messages


def test_a_trainer_asks_an_unanswering_cloud_less_and_less_often() -> None:
    """A mistyped --cloud was asked (and logged) every 5 s poll for ever."""
    assert [idle_wait(5.0, failures) for failures in (0, 1, 2, 3, 4, 100)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert idle_wait(120.0, 3) == 120.0  # never more often than the poll asks for


def test_an_option_spelled_short_is_refused_not_taken_for_a_longer_one(capsys: pytest.CaptureFixture[str]) -> None:
    """`--token T` is no option of `trainer serve`: argparse's prefix matching used to take it as `--token-env T`
    and the trainer then said "$T is empty"."""
    with pytest.raises(SystemExit) as exit_info:
        main(["trainer", "serve", "--cloud", "http://127.0.0.1:9", "--token", "a-token-of-sixteen-chars"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --token a-token-of-sixteen-chars" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["cloud:8000", "ftp://cloud", "http://", "http://cloud:99999"])
def test_a_cloud_url_that_is_not_one_is_refused_before_any_request(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FF_TRAINER_TOKEN", TRAINER_TOKEN)
    assert main(["trainer", "serve", "--cloud", url, "--once"]) == 2
    assert capsys.readouterr().err == (
        f"filterforward trainer: error: cloud URL {url!r} is not http(s)://HOST[:PORT]: e.g. http://cloud:8000\n"
    )
