"""Benchmark: the cloud's ingest of matched frames from 1, 10 and 50 simulated edges on loopback.

A real cloud server process (`filterforward cloud serve`, SQLite by default or --database-url) and, in this
process, N real edge uplinks (edge.uplink.Uplink over edge.link.Link: disk spool, credit window, acks) sending
a real JPEG of the intel-car clip. Two measurements per N:

* throughput: every edge's spool is filled first (--frames in all), then the uplinks start; matched
  frames/s = frames / time until the cloud has acknowledged them all (stored + acked);
* latency: each edge sends --rate frames/s for --seconds; frame-to-stored latency = the row's
  `received_at` (cloud clock, when the row was written) minus `captured_at` (the edge's clock when the
  frame entered its spool); both clocks are this machine's. p50 and p99 over every frame.

    python bench/ingest.py                 # 1, 10, 50 edges (about 2 minutes on 2 cores)
    python bench/ingest.py --quick         # a smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from cloud_process import wait_healthy, write_cloud_config
from sqlalchemy import select

from cloud.config import load_cloud_config
from cloud.db import StoredFrame, make_engine
from edge.config import CloudLink, SpoolConfig
from edge.encoder import encode_jpeg
from edge.link import Link
from edge.sink import MatchedFrame
from edge.uplink import Uplink

log = logging.getLogger("bench.ingest")
REPO = Path(__file__).resolve().parents[1]
CLIP = REPO.parent / "shared" / "data" / "intel-car-detection" / "car-detection.mp4"
TOKEN = "bench-token-0123456789abcdef"
RUN = secrets.token_hex(4)  # in the edge ids: a reused database (PostgreSQL) may hold an earlier run's rows


@dataclass
class Result:
    edges: int
    frames: int
    frames_per_s: float
    latency_frames: int
    p50_ms: float
    p99_ms: float


def sample_jpeg() -> bytes:
    """A real frame of the intel-car clip as JPEG q80 (a synthetic image when the clips are absent)."""
    import cv2

    capture = cv2.VideoCapture(str(CLIP))
    capture.set(cv2.CAP_PROP_POS_FRAMES, 200)
    ok, image = capture.read()
    capture.release()
    if not ok:
        log.warning("%s not found: sending a synthetic frame", CLIP)
        image = np.random.default_rng(0).integers(0, 255, (432, 768, 3), dtype=np.uint8)
    return encode_jpeg(cv2.resize(image, (768, 432)), 80)


class Cloud:
    """The cloud server as its own process (bench/cloud_process.py), with insecure ZeroMQ on loopback."""

    def __init__(self, folder: Path, database_url: str | None):
        settings = {"database_url": database_url} if database_url else {}
        path = write_cloud_config(folder, TOKEN, {"insecure": True}, **settings)
        config = load_cloud_config(path)
        self.ingest, self.publish = config.zmq.ingest_port, config.zmq.publish_port
        self.db_url = config.db_url
        command = [sys.executable, "-m", "filterforward", "cloud", "serve", "--config", str(path)]
        with open(folder / "cloud.log", "w") as cloud_log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=cloud_log)
        wait_healthy(config.base_url, self.process, folder / "cloud.log")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def make_edges(cloud: Cloud, folder: Path, count: int, tag: str) -> list[Uplink]:
    link = CloudLink(address="127.0.0.1", ingest_port=cloud.ingest, publish_port=cloud.publish, insecure=True)
    return [
        Uplink(Link(f"{tag}-{i}", ["cam"], link), SpoolConfig(path=folder / f"{tag}-{i}", max_bytes=2**32))
        for i in range(count)
    ]


def close(edge: Uplink) -> None:
    edge.link.close()  # first: the link's thread reads the uplink's spool
    edge.close()


def send(edge: Uplink, index: int, jpeg: bytes) -> None:
    edge.frame(MatchedFrame("cam", index, index / 30, time.time(), {"bench": 0.9}, [], jpeg))


def throughput(cloud: Cloud, folder: Path, count: int, frames: int, jpeg: bytes) -> tuple[int, float]:
    edges = make_edges(cloud, folder, count, f"t{count}-{RUN}")
    per_edge = max(1, frames // count)
    for edge in edges:
        for index in range(per_edge):
            send(edge, index, jpeg)
    started = time.perf_counter()
    for edge in edges:
        edge.link.start()
    deadline = started + 600
    for edge in edges:
        if not edge.wait_drained(max(1.0, deadline - time.perf_counter())):
            raise RuntimeError(f"{edge.link.edge_id}: not drained within 10 minutes")
    elapsed = time.perf_counter() - started
    for edge in edges:
        close(edge)
    return per_edge * count, per_edge * count / elapsed


def latency(cloud: Cloud, folder: Path, count: int, rate: float, seconds: float, jpeg: bytes) -> np.ndarray:
    tag = f"l{count}-{RUN}"
    edges = make_edges(cloud, folder, count, tag)
    for edge in edges:
        edge.link.start()
    time.sleep(1.0)  # connected before the clock starts
    ticks = int(rate * seconds)
    started = time.perf_counter()
    for tick in range(ticks):
        # Spread each tick's frames over the tick, as independent cameras would.
        for i, edge in enumerate(edges):
            target = started + (tick + i / count) / rate
            time.sleep(max(0.0, target - time.perf_counter()))
            send(edge, tick, jpeg)
    for edge in edges:
        edge.wait_drained(120)
        close(edge)
    engine = make_engine(cloud.db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(StoredFrame.received_at, StoredFrame.captured_at).where(StoredFrame.edge_id.like(f"{tag}-%"))
        ).all()
    engine.dispose()
    return np.array([(r.received_at - r.captured_at).total_seconds() * 1000 for r in rows])


def run(args: argparse.Namespace) -> tuple[list[Result], int]:
    jpeg = sample_jpeg()
    results = []
    with tempfile.TemporaryDirectory(prefix="ff-bench-ingest-") as tmp:
        folder = Path(tmp)
        cloud = Cloud(folder, args.database_url)
        try:
            for count in args.edges:
                frames, fps = throughput(cloud, folder, count, args.frames, jpeg)
                lat = latency(cloud, folder, count, args.rate, args.seconds, jpeg)
                results.append(
                    Result(count, frames, fps, len(lat), float(np.percentile(lat, 50)), float(np.percentile(lat, 99)))
                )
                log.info("%d edges: %.0f frames/s, p50 %.1f ms, p99 %.1f ms", count, fps, *np.percentile(lat, [50, 99]))
        finally:
            cloud.close()
    return results, len(jpeg)


def print_table(results: list[Result], jpeg_bytes: int, args: argparse.Namespace) -> None:
    print(f"\ningest on loopback, {jpeg_bytes / 1024:.0f} KiB JPEG per frame, {args.database_url or 'SQLite'}")
    print(f"latency at {args.rate:g} frames/s per edge for {args.seconds:g} s")
    print(f"{'edges':>5} {'frames':>7} {'frames/s':>9} {'vs 1 edge':>9} {'p50 ms':>8} {'p99 ms':>8}")
    base = results[0].frames_per_s
    for r in results:
        print(
            f"{r.edges:>5} {r.frames:>7} {r.frames_per_s:>9.0f} {r.frames_per_s / base:>9.2f} "
            f"{r.p50_ms:>8.1f} {r.p99_ms:>8.1f}"
        )


def plot(results: list[Result], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = [r.edges for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar([str(e) for e in edges], [r.frames_per_s for r in results])
    left.set(xlabel="simulated edges", ylabel="matched frames/s stored", title="ingest throughput")
    right.plot(edges, [r.p50_ms for r in results], "o-", label="p50")
    right.plot(edges, [r.p99_ms for r in results], "s-", label="p99")
    right.set(xscale="log", xlabel="simulated edges", ylabel="frame-to-stored latency (ms)", title="latency")
    right.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", default="1,10,50", help="comma-separated edge counts (default 1,10,50)")
    parser.add_argument("--frames", type=int, default=3000, help="frames in the throughput run (default 3000)")
    parser.add_argument("--rate", type=float, default=2.0, help="frames/s per edge in the latency run (default 2)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the latency run (default 15)")
    parser.add_argument("--database-url", help="a PostgreSQL URL instead of the default SQLite")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for the JSON and plot")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 and 4 edges, 200 frames, 3 s")
    args = parser.parse_args()
    args.edges = [1, 4] if args.quick else [int(n) for n in args.edges.split(",")]
    if args.quick:
        args.frames, args.seconds = 200, 3.0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("edge").setLevel(logging.WARNING)
    results, jpeg_bytes = run(args)
    print_table(results, jpeg_bytes, args)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()}}
    (args.out / "ingest.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2))
    plot(results, args.out / "ingest.png")
    print(f"wrote {args.out / 'ingest.json'} and {args.out / 'ingest.png'}")


if __name__ == "__main__":
    main()
