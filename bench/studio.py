"""The filter studio's loop against the clock (issue 13's target: footage request to a deployed filter within 3
minutes for 300 frames, the person's labelling time excluded), every part a real process on loopback:

  `filterforward cloud serve` (insecure ZeroMQ), `filterforward edge run` replaying the car clip (looped, so the
  camera keeps playing) in real time at 12.5 fps, and `filterforward trainer serve --once` for the job.

Steps, each timed from the footage request:
  footage    POST /api/datasets/footage for every frame, up to --frames, until the dataset is complete
  labels     PUT /api/datasets/{name}/labels: the clip's ground truth at the camera frames the footage holds (the
             stand-in for the person, whose time is excluded)
  training   POST /api/training-jobs, then the trainer claims it, downloads the dataset, computes the base-DNN
             features, cross-validates and trains the default filter, and posts the bundle
  deploy     POST /api/training-jobs/{id}/deploy
  event      the first event of the new filter stored in the cloud (the edge took the filter and it fired)

    .venv/bin/python bench/studio.py                   # 300 frames of the car clip, vehicle_present
    .venv/bin/python bench/studio.py --frames 150 --json bench/out/studio.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from cloud_process import free_port, wait_healthy, write_cloud_config
from upload import data_root, looped_clip

from models.datasets import LabelledDataset, open_dataset

REPO = Path(__file__).resolve().parents[1]
TOKEN = "studio-bench-operator-token-0123"
TRAINER_TOKEN = "studio-bench-trainer-token-4567"
EDGE_ID, CAMERA = "edge-1", "gate"
WAIT_S = 600.0  # bounds each wait; only a broken setup reaches it


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)


def filterforward(*args: str) -> list[str]:
    return [sys.executable, "-m", "filterforward", *args]


def start_cloud(work: Path) -> tuple[subprocess.Popen, str, dict[str, Any]]:
    tokens = [
        {"name": "operator", "token": TOKEN, "scopes": ["read", "write"]},
        {"name": "trainer", "token": TRAINER_TOKEN, "scopes": ["train"]},
    ]
    path = write_cloud_config(work, TOKEN, {"insecure": True}, tokens=tokens, max_upload_bytes=2**22)
    config = yaml.safe_load(path.read_text())
    url = f"http://127.0.0.1:{config['port']}"
    process = run(filterforward("cloud", "serve", "--config", str(path)), work / "cloud.log")
    wait_healthy(url, process, work / "cloud.log")
    return process, url, config["zmq"]


def start_edge(work: Path, clip: Path, zmq: dict[str, Any]) -> subprocess.Popen:
    config = {
        "edge_id": EDGE_ID,
        "cameras": [{"name": CAMERA, "source": str(clip), "pacing": "realtime"}],
        "cloud": {
            "address": "127.0.0.1",
            "ingest_port": zmq["ingest_port"],
            "publish_port": zmq["publish_port"],
            "insecure": True,
        },
        "spool": {"path": str(work / "spool")},
        "metrics_port": free_port(),
    }
    path = work / "edge.yaml"
    path.write_text(yaml.safe_dump(config))
    return run(filterforward("edge", "run", "--config", str(path)), work / "edge.log")


def wait_for(what: str, condition: Any, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(poll)
    raise SystemExit(f"timed out waiting for {what}")


def studio_loop(api: httpx.Client, url: str, dataset: LabelledDataset, event: str, frames: int, work: Path) -> dict:
    """The loop's steps, each as seconds since the footage request."""
    times: dict[str, float] = {}
    wait_for("the edge's hello", lambda: any(edge["id"] == EDGE_ID for edge in api.get("/api/edges").json()))
    started = time.monotonic()
    body = {"name": "gate", "edge": EDGE_ID, "camera": CAMERA, "every": 0, "duration": 3600, "max_frames": frames}
    api.post("/api/datasets/footage", json=body).raise_for_status()
    wait_for("the footage", lambda: api.get("/api/datasets/gate").json()["status"] == "complete")
    times["footage"] = time.monotonic() - started

    labels_csv = api.get("/api/datasets/gate/labels.csv").text.splitlines()
    camera_frames = [int(line.rsplit(",", 1)[1]) for line in labels_csv[1:]] or list(range(frames))
    truth = dataset.labels[event][np.asarray(camera_frames) % dataset.n_frames]  # the looped clip's frame
    labels = [{"frame": number, "value": int(value)} for number, value in enumerate(truth)]
    api.put("/api/datasets/gate/labels", json={"event": event, "labels": labels}).raise_for_status()
    times["labels"] = time.monotonic() - started

    job = api.post("/api/training-jobs", json={"dataset": "gate", "event": event, "filter": "gate-studio"})
    job.raise_for_status()
    command = filterforward("trainer", "serve", "--cloud", url, "--once", "--work", str(work / "trainer"))
    trainer = run(command, work / "trainer.log", {**os.environ, "FF_TRAINER_TOKEN": TRAINER_TOKEN})
    if trainer.wait(timeout=WAIT_S) != 0:
        raise SystemExit(f"the trainer failed; see {work / 'trainer.log'}")
    done = api.get(f"/api/training-jobs/{job.json()['id']}").json()
    times["training"] = time.monotonic() - started

    api.post(f"/api/training-jobs/{done['id']}/deploy").raise_for_status()
    times["deploy"] = time.monotonic() - started
    wait_for(
        "an event of the new filter", lambda: api.get("/api/events", params={"filter": "gate-studio"}).json()["items"]
    )
    times["event"] = time.monotonic() - started
    report = done.get("result") or {}
    return {"seconds": times, "positives": int((truth == 1).sum()), "estimate": report.get("validation")}


def print_table(result: dict[str, Any]) -> None:
    print(f"\nstudio loop, {result['frames']} frames of {result['clip']} ({result['event']}), on {result['machine']}")
    print(f"{'step':<10} {'at s':>7} {'took s':>7}")
    previous = 0.0
    for step, at in result["seconds"].items():
        print(f"{step:<10} {at:7.1f} {at - previous:7.1f}")
        previous = at
    total = result["seconds"]["event"]
    print(
        f"footage request to the deployed filter's first event: {total:.0f} s (target <= 180 s: "
        f"{'ok' if total <= 180 else 'MISS'}); positives labelled {result['positives']}; estimate {result['estimate']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=300, help="footage frames (default 300)")
    parser.add_argument("--event", default="vehicle_present", help="the car clip's event to label")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    dataset = open_dataset(data_root() / "intel-car-detection")
    with tempfile.TemporaryDirectory(prefix="ff-studio-") as folder:
        work = Path(folder)
        loops = max(2, int(np.ceil(2 * args.frames / dataset.n_frames)) + 1)  # the camera plays on after the footage
        clip = looped_clip(dataset, loops, work / "looped.mp4")
        cloud, url, zmq = start_cloud(work)
        edge = start_edge(work, clip, zmq)
        try:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
                result = studio_loop(api, url, dataset, args.event, args.frames, work)
        finally:
            for process in (edge, cloud):
                process.terminate()
                process.wait(timeout=60)
    machine = f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}"
    result.update(frames=args.frames, clip=dataset.name, event=args.event, machine=machine)
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
