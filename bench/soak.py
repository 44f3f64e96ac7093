"""Soak: three live cameras on one edge process at real-time pacing, against a real cloud, for minutes.

Everything runs as the operator would run it, as separate processes on loopback: three live cameras looping the
real intel-car clip (GStreamer RTSP servers, tests/rtsp_server.py under Debian's python3, or
`filterforward camera serve` MJPEG cameras), `filterforward cloud serve` with CURVE keys made by
`filterforward keys create`, and one `filterforward edge run` on the three cameras. Two filters are registered
over REST: the red-vehicle filter trained by `filterforward train` (the default filter unless --arch names an MC
kind; an event per loop of the clip on every camera) and an exported MC whose output bias makes it fire on every
frame, so every processed frame goes to the cloud.

Every --interval seconds it samples each camera's fps (the edge's stats as the cloud's /api/cameras shows them),
the edge's and the cloud's RSS and CPU (/proc), the edge's spool depth (/api/edges) and the frames stored. At the
end the edge gets SIGTERM and the run checks, against the edge's spool and the cloud's database, that every
sequence number the edge assigned was stored (lost matched frames must be 0), then reports fps steadiness
(min/mean/max per camera after the warm-up) and memory growth (RSS slope after the warm-up; first against last
minute).

    .venv/bin/python bench/soak.py              # 5 minutes
    .venv/bin/python bench/soak.py --quick      # a 1-minute smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import sqlalchemy as sa
import yaml
from cloud_process import START_TIMEOUT_S, free_port, wait_healthy, write_cloud_config

from cloud.config import load_cloud_config
from cloud.db import Event, Received, StoredFrame, make_engine
from edge.spool import Spool
from models.mc_kinds import MC_KINDS

log = logging.getLogger("bench.soak")
REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with gi + GstRtspServer for the RTSP cameras
RTSP_SERVER = REPO / "tests" / "rtsp_server.py"
RTSP_PACKAGES = "gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 python3-gi python3-gst-1.0 gstreamer1.0-plugins-bad"
EDGE_ID = "soak-edge"
TOKEN = "soak-operator-token-0123456789"
RED, ALWAYS = "red-car", "always"
DEFAULT_FILTER = "default"  # `filterforward train` without --arch
TRAIN_FRAMES = "0:212"  # the split of the README's red-vehicle result
SPOOL_BYTES = 2**30
STEADY_FPS = 0.9  # a camera is steady when every sample after the warm-up is at least this share of its clip's fps
MAX_GROWTH_MB_PER_MIN = 1.0  # "no growth in memory": the edge's RSS slope after the warm-up stays below this
MEMORY_WINDOW_S = 120.0  # a shorter stretch after the warm-up gives no memory verdict (still warming up)


def default_dataset() -> Path:
    env = os.environ.get("FILTERFORWARD_DATA")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root / "intel-car-detection"


def filterforward(*args: str) -> list[str]:
    return [sys.executable, "-m", "filterforward", *args]


def run_command(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        raise SystemExit(f"{what} failed: {lines[-1]}")


# ---------------------------------------------------------------------------------------------------------
# /proc readings (psutil is not a dependency)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------------------
# The processes


class Processes:
    """Every child process of the run; each is stopped with SIGTERM (SIGKILL after 30 s) at the end."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []

    def start(self, command: list[str], log_path: Path, wait_ready: bool = False) -> subprocess.Popen:
        out = log_path.open("a")
        stdout = subprocess.PIPE if wait_ready else out
        child = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=out, text=True)
        out.close()  # the child keeps its own descriptor
        self.children.append(child)
        if wait_ready:
            ready, _, _ = select.select([child.stdout], [], [], START_TIMEOUT_S)
            if not ready or child.stdout.readline().strip() != "ready":
                raise SystemExit(f"`{' '.join(command[1:4])}` did not start; see {log_path}")
        return child

    @staticmethod
    def stop(child: subprocess.Popen) -> int:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
        try:
            return child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait()

    def stop_all(self) -> None:
        for child in reversed(self.children):
            self.stop(child)
            if child.stdout:
                child.stdout.close()


def rtsp_missing() -> str:
    """Why GStreamer's RTSP server can't run here, or ''."""
    probe = "import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import GstRtspServer"
    try:
        result = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return "" if result.returncode == 0 else (result.stderr.strip().splitlines() or ["probe failed"])[-1]


def start_cameras(kind: str, clip: Path, count: int, work: Path, processes: Processes) -> list[str]:
    """`count` live cameras looping the clip; their URLs."""
    urls = []
    for number in range(1, count + 1):
        port = free_port()
        if kind == "rtsp":
            command = [SYSTEM_PYTHON, str(RTSP_SERVER), "--clip", str(clip), "--port", str(port)]
            urls.append(f"rtsp://127.0.0.1:{port}/cam")
        else:
            command = filterforward("camera", "serve", str(clip), "--port", str(port))
            urls.append(f"http://127.0.0.1:{port}/")
        processes.start(command, work / f"camera-{number}.log", wait_ready=True)
    return urls


@dataclass
class Cloud:
    config_path: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return load_cloud_config(self.config_path).base_url

    @property
    def db_url(self) -> str:
        return load_cloud_config(self.config_path).db_url

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def make_keys(work: Path) -> Path:
    keys = work / "keys"
    for name in ("cloud", EDGE_ID):
        run_command(filterforward("keys", "create", name, "--dir", str(keys)), f"keys create {name}")
    (keys / "edges").mkdir()
    shutil.copy(keys / f"{EDGE_ID}.key", keys / "edges" / f"{EDGE_ID}.key")
    return keys


def start_cloud(work: Path, keys: Path, processes: Processes) -> Cloud:
    zmq = {"secret_key": str(keys / "cloud.key_secret"), "edge_keys": str(keys / "edges")}
    path = write_cloud_config(work, TOKEN, zmq)
    cloud = Cloud(path, processes.start(filterforward("cloud", "serve", "--config", str(path)), work / "cloud.log"))
    wait_healthy(cloud.url, cloud.process, work / "cloud.log")
    return cloud


def write_edge_config(work: Path, keys: Path, cloud: Cloud, urls: list[str], args: argparse.Namespace) -> Path:
    zmq = load_cloud_config(cloud.config_path).zmq
    config = {
        "edge_id": EDGE_ID,
        "input_size": list(args.input_size),
        "defaults": {"pacing": "realtime"},
        "cameras": [{"name": f"cam-{number}", "source": url} for number, url in enumerate(urls, 1)],
        "cloud": {
            "address": "127.0.0.1",
            "ingest_port": zmq.ingest_port,
            "publish_port": zmq.publish_port,
            "server_key": str(keys / "cloud.key"),
            "secret_key": str(keys / f"{EDGE_ID}.key_secret"),
        },
        "spool": {"path": str(work / "spool"), "max_bytes": SPOOL_BYTES},
        "stats_interval": args.interval / 2,  # each sample sees a stats window of its own
    }
    path = work / "edge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ---------------------------------------------------------------------------------------------------------
# The filters


def train_red(dataset: Path, input_size: tuple[int, int], arch: str, work: Path) -> Path:
    """The red-vehicle filter as `filterforward train` makes it: the default filter, or one MC kind (--arch)."""
    out = work / "red"
    size = "x".join(map(str, input_size))
    command = filterforward(
        "train", str(dataset), "--event", "red_vehicle_present", "--input-size", size,
        "--frames", TRAIN_FRAMES, "--out", str(out), *(() if arch == DEFAULT_FILTER else ("--arch", arch)),
    )  # fmt: skip
    run_command(command, f"training the red-vehicle filter ({arch})")
    return out


def always_firing_bundle(input_size: tuple[int, int], work: Path) -> Path:
    """A full_frame MC on `late` that scores sigmoid(10) on every frame: steady traffic on every camera."""
    from models.bundle import write_bundle
    from models.filterspec import FilterSpec
    from models.mc_export import export_constant_mc
    from models.microclassifiers import build_mc
    from models.taps import EFFICIENTNET_LITE0_TAPS

    spec = FilterSpec(name=ALWAYS, architecture="full_frame", tap="late", input_size=input_size)
    channels, height, width = EFFICIENTNET_LITE0_TAPS["late"].shape(input_size)
    crop = (channels, *spec.roi.cell_shape(height, width))
    model = build_mc("full_frame", crop[0], crop[1:], spec.window)
    return write_bundle(work / ALWAYS, spec, export_constant_mc(model, crop, 10.0))


def register(cloud: Cloud, bundle: Path, name: str) -> None:
    spec = {**json.loads((bundle / "spec.json").read_text()), "name": name}
    files = {"model": ("model.onnx", (bundle / "model.onnx").read_bytes(), "application/octet-stream")}
    with cloud.client() as client:
        response = client.post("/api/filters", data={"spec": json.dumps(spec)}, files=files)
    if response.status_code != 201:
        raise SystemExit(f"registering {name} failed: {response.status_code} {response.text}")


# ---------------------------------------------------------------------------------------------------------
# Sampling


@dataclass
class Sample:
    t: float  # seconds since the edge started
    fps: dict[str, float]  # per camera, over the edge's last stats window
    dropped: dict[str, int]  # per camera, since the start
    online: dict[str, bool]
    decode_ms: dict[str, float]  # per camera, when the edge reports it
    edge_rss_mb: float
    cloud_rss_mb: float
    edge_cpu: float  # cores the edge used since the previous sample
    cloud_cpu: float
    spool_messages: int
    in_flight: int
    stored_frames: int


class Sampler:
    """Takes samples of the running edge and cloud; CPU use is per interval between samples."""

    def __init__(self, cloud: Cloud, edge: subprocess.Popen) -> None:
        self.cloud, self.edge = cloud, edge
        self.started = time.monotonic()
        self._last = (self.started, 0.0, cpu_seconds(cloud.process.pid))  # (clock, edge CPU s, cloud CPU s)

    def take(self) -> Sample:
        with self.cloud.client() as client:
            cameras = [c for c in client.get("/api/cameras").json() if c["edge"] == EDGE_ID]
            uplink = client.get(f"/api/edges/{EDGE_ID}").json()["stats"] if cameras else {}
            stored = client.get("/api/stats").json()["frames"]
        now = (time.monotonic(), cpu_seconds(self.edge.pid), cpu_seconds(self.cloud.process.pid))
        edge_cpu, cloud_cpu = ((now[i] - self._last[i]) / (now[0] - self._last[0]) for i in (1, 2))
        self._last = now
        return Sample(
            t=now[0] - self.started,
            fps={c["name"]: c["stats"].get("fps", 0.0) for c in cameras},
            dropped={c["name"]: int(c["stats"].get("dropped", 0)) for c in cameras},
            online={c["name"]: c["online"] for c in cameras},
            decode_ms={c["name"]: c["stats"]["decode_ms"] for c in cameras if "decode_ms" in c["stats"]},
            edge_rss_mb=rss_mb(self.edge.pid),
            cloud_rss_mb=rss_mb(self.cloud.process.pid),
            edge_cpu=edge_cpu,
            cloud_cpu=cloud_cpu,
            spool_messages=int(uplink.get("spool_messages", 0)),
            in_flight=int(uplink.get("in_flight", 0)),
            stored_frames=stored,
        )


def soak(sampler: Sampler, seconds: float, interval: float, work: Path) -> list[Sample]:
    samples: list[Sample] = []
    while (due := sampler.started + (len(samples) + 1) * interval) <= sampler.started + seconds:
        time.sleep(max(0.0, due - time.monotonic()))
        if sampler.edge.poll() is not None:
            raise SystemExit(f"the edge exited with {sampler.edge.returncode} mid-soak; see {work / 'edge.log'}")
        samples.append(sampler.take())
        s = samples[-1]
        fps = " ".join(f"{name} {value:5.2f}" for name, value in sorted(s.fps.items()))
        log.info(
            "t=%4.0f s  fps %s  edge RSS %.0f MB CPU %.2f  spool %d  stored %d",
            s.t, fps, s.edge_rss_mb, s.edge_cpu, s.spool_messages, s.stored_frames,
        )  # fmt: skip
    return samples


# ---------------------------------------------------------------------------------------------------------
# Checks and summary


@dataclass
class Delivery:
    assigned: int  # seqs the edge handed out during the run (frames and event starts/ends)
    stored: int  # of those, how many the cloud stored
    lost: int
    left_in_spool: int
    frames: int
    events: int
    open_events: int
    red_events: dict[str, int]
    edge_exit: int
    shutdown_s: float


def first_seq(spool_dir: Path) -> int:
    """The seq the edge will assign first: the spool file is created here, before the edge starts."""
    spool = Spool(spool_dir, SPOOL_BYTES)
    try:
        return spool.last_seq + 1
    finally:
        spool.close()


def check_delivery(cloud: Cloud, spool_dir: Path, first: int, edge_exit: int, shutdown_s: float) -> Delivery:
    spool = Spool(spool_dir, SPOOL_BYTES)
    try:
        last, left = spool.last_seq, spool.messages
    finally:
        spool.close()
    engine = make_engine(cloud.db_url)
    try:
        with engine.connect() as db:
            received = set(db.execute(sa.select(Received.seq).where(Received.edge_id == EDGE_ID)).scalars())
            frames = db.execute(sa.select(sa.func.count()).select_from(StoredFrame)).scalar_one()
            events = db.execute(sa.select(Event.camera, Event.filter, Event.end_frame)).all()
    finally:
        engine.dispose()
    stored = len(received & set(range(first, last + 1)))
    red: dict[str, int] = {}
    for camera, name, _ in events:
        red[camera] = red.get(camera, 0) + (name == RED)
    return Delivery(
        assigned=last - first + 1,
        stored=stored,
        lost=last - first + 1 - stored,
        left_in_spool=left,
        frames=frames,
        events=len(events),
        open_events=sum(end is None for *_, end in events),
        red_events=dict(sorted(red.items())),
        edge_exit=edge_exit,
        shutdown_s=shutdown_s,
    )


def slope_per_minute(times: np.ndarray, values: np.ndarray) -> float:
    return float(np.polyfit(times / 60.0, values, 1)[0]) if len(times) >= 2 else float("nan")


def camera_summary(name: str, steady: list[Sample], clip_fps: float) -> dict:
    """fps min/mean/max, frames dropped (and their share of what the camera sent) over the samples."""
    fps = np.array([s.fps.get(name, 0.0) for s in steady])
    decode = [s.decode_ms[name] for s in steady if name in s.decode_ms]
    dropped = steady[-1].dropped.get(name, 0) - steady[0].dropped.get(name, 0)
    sent = clip_fps * (steady[-1].t - steady[0].t)
    return {
        "fps_min": float(fps.min()),
        "fps_mean": float(fps.mean()),
        "fps_max": float(fps.max()),
        "dropped_after_warmup": dropped,
        "dropped_share": dropped / sent if sent else 0.0,
        "decode_ms": float(np.mean(decode)) if decode else None,
        "steady": bool(fps.min() >= STEADY_FPS * clip_fps),
    }


def memory_summary(steady: list[Sample]) -> dict:
    """The edge's RSS in the first and last minute and its slope, the cloud's slope; no verdict on a short run."""
    times, rss = np.array([s.t for s in steady]), np.array([s.edge_rss_mb for s in steady])
    slope = slope_per_minute(times, rss)
    return {
        "edge_rss_mb": {
            "first_minute": float(rss[times <= times[0] + 60].mean()),
            "last_minute": float(rss[times >= times[-1] - 60].mean()),
            "peak": float(rss.max()),
        },
        "edge_rss_slope_mb_per_min": slope,
        "cloud_rss_slope_mb_per_min": slope_per_minute(times, np.array([s.cloud_rss_mb for s in steady])),
        "no_memory_growth": bool(slope < MAX_GROWTH_MB_PER_MIN) if times[-1] - times[0] >= MEMORY_WINDOW_S else None,
    }


def summarize(samples: list[Sample], warmup: float, clip_fps: float, delivery: Delivery) -> dict:
    steady = [s for s in samples if s.t > warmup]
    if not steady:
        raise SystemExit(f"no sample after the {warmup:g} s warm-up; run longer or shorten --warmup")
    cameras = {name: camera_summary(name, steady, clip_fps) for name in camera_names(steady)}
    memory = memory_summary(steady)
    memory_ok = memory.pop("no_memory_growth")
    return {
        "clip_fps": clip_fps,
        "cameras": cameras,
        **memory,
        "edge_cpu_cores": float(np.mean([s.edge_cpu for s in steady])),
        "cloud_cpu_cores": float(np.mean([s.cloud_cpu for s in steady])),
        "spool_max": max(s.spool_messages for s in steady),
        "stored_per_s": (steady[-1].stored_frames - steady[0].stored_frames) / max(steady[-1].t - steady[0].t, 1e-9),
        "delivery": asdict(delivery),
        "verdicts": {
            "steady_fps": all(c["steady"] for c in cameras.values()),
            "no_memory_growth": memory_ok,
            "zero_lost": delivery.lost == 0 and delivery.left_in_spool == 0,
        },
    }


VERDICT = {True: "ok", False: "FAILED", None: f"n/a (under {MEMORY_WINDOW_S:g} s after the warm-up)"}


def print_table(summary: dict, meta: dict) -> None:
    print(
        f"\nsoak: {meta['cameras']} {meta['camera_kind']} cameras looping {meta['clip']} ({summary['clip_fps']:g} fps)"
        f" on one edge at {meta['input_size']} (red-vehicle filter: {meta['arch']}), {meta['seconds'] / 60:g} min,"
        f" warm-up {meta['warmup']:g} s;"
        f" {meta['cpus']} CPUs, load average {meta['load_before']} before, {meta['load_after']} after"
    )
    print(f"{'camera':<8} {'fps min':>8} {'mean':>7} {'max':>7} {'dropped':>14} {'decode ms':>10}  steady")
    for name, c in summary["cameras"].items():
        decode = f"{c['decode_ms']:.1f}" if c["decode_ms"] is not None else "-"
        print(
            f"{name:<8} {c['fps_min']:>8.2f} {c['fps_mean']:>7.2f} {c['fps_max']:>7.2f} "
            f"{c['dropped_after_warmup']:>6d} ({c['dropped_share']:5.1%}) {decode:>10}  {'ok' if c['steady'] else 'NO'}"
        )
    rss, d, v = summary["edge_rss_mb"], summary["delivery"], summary["verdicts"]
    red = ", ".join(map(str, d["red_events"].values()))
    rows = [
        ("edge RSS first / last minute", f"{rss['first_minute']:.1f} / {rss['last_minute']:.1f} MB"),
        ("edge RSS slope after warm-up", f"{summary['edge_rss_slope_mb_per_min']:+.2f} MB/min"),
        ("cloud RSS slope after warm-up", f"{summary['cloud_rss_slope_mb_per_min']:+.2f} MB/min"),
        ("edge / cloud CPU", f"{summary['edge_cpu_cores']:.2f} / {summary['cloud_cpu_cores']:.2f} cores"),
        ("spool depth, max sampled", f"{summary['spool_max']} messages"),
        ("frames stored", f"{d['frames']} ({summary['stored_per_s']:.1f}/s after warm-up)"),
        ("events", f"{d['events']}, {d['open_events']} open (red-car per camera: {red})"),
        ("seqs assigned / stored", f"{d['assigned']} / {d['stored']}"),
        ("lost matched frames", f"{d['lost']} (left in spool: {d['left_in_spool']})"),
        ("edge exit on SIGTERM", f"status {d['edge_exit']} after {d['shutdown_s']:.1f} s"),
    ]
    for label, value in rows:
        print(f"{label:<32} {value}")
    verdict = ", ".join(f"{name} {VERDICT[ok]}" for name, ok in v.items())
    print(f"verdicts: {verdict}")


def camera_names(samples: list[Sample]) -> list[str]:
    return sorted(set().union(*(s.fps for s in samples)))


def plot(samples: list[Sample], warmup: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [s.t for s in samples]
    fig, (fps_axis, rss_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for name in camera_names(samples):
        fps_axis.plot(times, [s.fps.get(name, 0.0) for s in samples], "o-", markersize=3, label=name)
    fps_axis.set(xlabel="seconds since the edge started", ylabel="frames/s (edge stats)", title="per-camera fps")
    fps_axis.set_ylim(bottom=0)
    fps_axis.legend()
    rss_axis.plot(times, [s.edge_rss_mb for s in samples], "o-", markersize=3, label="edge")
    rss_axis.plot(times, [s.cloud_rss_mb for s in samples], "s-", markersize=3, label="cloud")
    rss_axis.set(xlabel="seconds since the edge started", ylabel="RSS (MB)", title="memory")
    rss_axis.legend()
    for axis in (fps_axis, rss_axis):
        axis.axvline(warmup, color="grey", linestyle=":", linewidth=1)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


# ---------------------------------------------------------------------------------------------------------
# The run


def clip_fps(clip: Path) -> float:
    import cv2

    capture = cv2.VideoCapture(str(clip))
    try:
        return float(capture.get(cv2.CAP_PROP_FPS))
    finally:
        capture.release()


def run(args: argparse.Namespace, work: Path) -> tuple[list[Sample], Delivery]:
    processes = Processes()
    try:
        log.info("training the red-vehicle filter and exporting the always-firing MC")
        red = train_red(args.dataset, args.input_size, args.arch, work)
        always = always_firing_bundle(args.input_size, work)
        keys = make_keys(work)
        cloud = start_cloud(work, keys, processes)
        register(cloud, red, RED)
        register(cloud, always, ALWAYS)
        urls = start_cameras(args.camera, args.clip, args.cameras, work, processes)
        edge_config = write_edge_config(work, keys, cloud, urls, args)
        first = first_seq(work / "spool")
        log.info("edge on %s; soaking for %g s", ", ".join(urls), args.seconds)
        edge = processes.start(filterforward("edge", "run", "--config", str(edge_config)), work / "edge.log")
        samples = soak(Sampler(cloud, edge), args.seconds, args.interval, work)
        stopping = time.monotonic()
        edge_exit = processes.stop(edge)
        return samples, check_delivery(cloud, work / "spool", first, edge_exit, time.monotonic() - stopping)
    finally:
        processes.stop_all()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the soak (default 5)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 minute, 15 s warm-up, 5 s samples")
    parser.add_argument("--cameras", type=int, default=3, help="live cameras on the edge (default 3)")
    parser.add_argument(
        "--camera", choices=("auto", "rtsp", "mjpeg"), default="auto",
        help="rtsp (GStreamer, Debian's python3-gi), mjpeg (`filterforward camera serve`); auto: rtsp if it can run",
    )  # fmt: skip
    parser.add_argument("--dataset", type=Path, default=default_dataset(), help="the intel-car dataset folder")
    parser.add_argument("--input-size", default="384x224", help="base-DNN input WxH (default 384x224)")
    parser.add_argument(
        "--arch", choices=(DEFAULT_FILTER, *MC_KINDS), default=DEFAULT_FILTER,
        help="the red-vehicle filter: the default filter of `filterforward train` (default) or one MC kind",
    )  # fmt: skip
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples (default 10)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds left out of the summary (default 60)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for soak.json and soak.png")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, spool, cloud data)")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.warmup, args.interval = 1.0, 15.0, 5.0
    args.seconds = args.minutes * 60
    args.input_size = tuple(int(n) for n in args.input_size.lower().split("x"))
    args.clip = args.dataset / "car-detection.mp4"
    if not args.clip.is_file():
        raise SystemExit(f"{args.clip} not found: pass --dataset or set FILTERFORWARD_DATA")
    if args.camera != "mjpeg" and (missing := rtsp_missing()):
        if args.camera == "rtsp":
            raise SystemExit(f"RTSP cameras can't run ({missing}): apt-get install {RTSP_PACKAGES}, or --camera mjpeg")
        log.warning("GStreamer's RTSP server is unavailable (%s): using MJPEG cameras", missing)
        args.camera = "mjpeg"
    args.camera = "rtsp" if args.camera == "auto" else args.camera
    return args


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    args = parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="ff-soak-"))
    try:
        samples, delivery = run(args, work)
    finally:
        if args.keep:
            log.info("work folder kept: %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    meta = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cameras": args.cameras,
        "camera_kind": args.camera,
        "clip": args.clip.name,
        "input_size": "x".join(map(str, args.input_size)),
        "arch": args.arch,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "interval": args.interval,
    }
    summary = summarize(samples, args.warmup, clip_fps(args.clip), delivery)
    print_table(summary, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"meta": meta, "summary": summary, "samples": [asdict(s) for s in samples]}
    (args.out / "soak.json").write_text(json.dumps(record, indent=2))
    plot(samples, args.warmup, args.out / "soak.png")
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    if False in summary["verdicts"].values():
        sys.exit(1)


if __name__ == "__main__":
    main()
