"""Benchmark: how many 768x432 12.5 fps cameras one edge process serves in real time, with 10 MCs each.

The real `edge.node.EdgeNode` (cameras in their own threads, realtime pacing, a folder sink, no cloud) runs N
cameras for a fixed time; each camera replays a loop of the real car clip (768x432, 12.5 fps) from its own start
frame, so the cameras never see the same frame at once. Every camera has its own 10 filters (the default
filter's shape: an ensemble of three full_frame MCs, on `mid` and `late` in turn, on five regions (with their
context cells) in turn; random weights, thresholds set so each passes about --match-share of the frames). N grows
1, 2, 3, ... per configuration until a camera drops a frame after the warm-up; configurations run side by side
(every N runs each configuration still in the race, in a rotating order): the fp32 base DNN, int8 (exported once,
calibrated on the car clip), and each with the change gate on (its default settings) and off.

Then one 1080p camera (adl-rundle-6, 1920x1080, looped at 12.5 fps) at the input size a 1080p camera gets by
default and at half of it, in the same four configurations: does it run in real time?

    .venv/bin/python bench/cameras.py             # the default run (10-11 minutes on 2 cores)
    .venv/bin/python bench/cameras.py --quick     # a smoke run (about 2 minutes)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import resource
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import numpy as np
from mc_scaling import DEFAULT_FILTER

from edge.config import CameraConfig, CameraDefaults, EdgeConfig, GateSettings, SinkConfig
from edge.mcbank import CameraState, MCBank
from edge.node import EdgeNode
from filterforward.commands.options import parse_size
from models.base_export import ensure_base_model
from models.base_precision import DEFAULT_CALIBRATION_FRAMES, export_precision
from models.basednn import BaseDNN
from models.bundle import write_bundle
from models.cache import cache_dir
from models.datasets.frames import probe, read_frames
from models.errors import FilterForwardError
from models.filterspec import FilterSpec, MotionVeto, Smoothing
from models.model_selection import CANDIDATES
from models.taps import default_input_size, round_input_size

log = logging.getLogger("bench.cameras")

REPO = Path(__file__).resolve().parents[1]
CAR = Path("intel-car-detection") / "car-detection.mp4"
HD = Path("adl-rundle-6") / "ADL-Rundle-6.mp4"
CAMERA_FPS = 12.5
SIZE = (768, 448)  # the edge's default input size (edge/config.py), the car clip's rounded size
TAPS = tuple(tap for _, tap in CANDIDATES)  # the default filter's candidate taps, in turn
CALIBRATION_FRAMES = 24  # frames spread over a clip on which each filter's threshold is set
CRF = {"car": 23, "hd": 20}  # x264 quality of the looped camera clips (the sources: 0.6 and 10.5 Mbit/s)
LOOSE_SHARE = 0.01  # the summary's second count: cameras served dropping at most this share of the frames
REALTIME_SHARE = 0.97  # a camera keeps up when it dropped nothing and processed this share of its frames
STATS_NEVER = 1e6  # the node's stats window never turns over during a run: the pipelines' counters add up


@dataclass(frozen=True)
class Variant:
    """One configuration of the edge: the base model's precision, whether the change gate is on, and the frames each
    camera queues ahead of the base DNN (the edge's default `buffer_frames` unless a name says '@F')."""

    name: str
    precision: str
    gate: bool
    buffer: int = CameraDefaults.model_fields["buffer_frames"].default
    veto: bool = False  # every filter has a motion veto, as trained default filters have (their region's MOG2)


VARIANTS = (
    Variant("fp32", "fp32", False),
    Variant("fp32+gate", "fp32", True),
    Variant("int8", "int8", False),
    Variant("int8+gate", "int8", True),
    Variant("bf16", "bf16", False),
    Variant("bf16+gate", "bf16", True),
)
DEFAULT_VARIANTS = "fp32,fp32+gate,int8,int8+gate"  # bf16 only where the CPU has it: ask for it by name
VETO = "+veto"  # a configuration's name + this: its filters carry MOTION_VETO
# A floor inside the range the development cases' default filters were fitted (0.1-5% of the region's pixels);
# what it costs (the camera's background model on every frame) does not depend on it.
MOTION_VETO = MotionVeto(min_foreground=0.01)


# ---------------------------------------------------------------------------------------------------------
# Camera clips: a loop of a recording from a start frame, as a real H.264 file the edge decodes


def looped_frames(source: Path, start: int) -> Iterator[np.ndarray]:
    """The recording's frames from `start` on, then from its first frame again, forever."""
    total = probe(source, fps=CAMERA_FPS).n_frames
    first = start % total
    while True:
        for _, image in read_frames(source, first, total):
            yield image
        first = 0


def looped_clip(source: Path, start: int, frames: int, crf: int, folder: Path) -> Path:
    """`frames` frames of the looped recording from frame `start`, encoded at CAMERA_FPS (cached in `folder`)."""
    import av

    path = folder / f"{source.stem}-from{start}-{frames}f-{CAMERA_FPS:g}fps-crf{crf}.mp4"
    if path.is_file():
        return path
    tmp = path.with_name(path.stem + ".tmp.mp4")
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(CAMERA_FPS).limit_denominator(1000))
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "fast"}
        for count, image in enumerate(looped_frames(source, start)):
            if count == frames:
                break
            if count == 0:
                stream.height, stream.width = image.shape[:2]
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")))
        container.mux(stream.encode(None))
    tmp.replace(path)
    return path


def camera_clips(source: Path, count: int, frames: int, crf: int, folder: Path) -> list[Path]:
    """One looped clip per camera, their start frames spread evenly over the recording."""
    total = probe(source, fps=CAMERA_FPS).n_frames
    return [looped_clip(source, i * total // count, frames, crf, folder) for i in range(count)]


# ---------------------------------------------------------------------------------------------------------
# Filters: 10 per camera, the default filter's shape, random weights, thresholds calibrated on the clip


@dataclass
class Weights:
    """One application's MC at one input size: a spec without base model or threshold, and its ONNX."""

    spec: FilterSpec
    onnx: bytes


def app_weights(size: tuple[int, int], count: int, seed: int, taps: tuple[str, ...] = TAPS) -> list[Weights]:
    """`count` default filters (mc_scaling's DEFAULT_FILTER: random weights, its regions with their context cells)
    on `taps` and those regions in turn."""
    import torch

    from models.mc_export import export_mc
    from models.taps import EFFICIENTNET_LITE0_TAPS

    # torch.onnx tracing warns about a Python boolean in the MC code on every export: noise here.
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    apps = []
    for j in range(count):
        kind = replace(DEFAULT_FILTER, tap=taps[j % len(taps)])
        channels, height, width = EFFICIENTNET_LITE0_TAPS[kind.tap].shape(size)
        boxes = kind.roi_boxes(size)
        roi = boxes[j % len(boxes)]
        crop = (channels, *roi.cell_shape(height, width))
        torch.manual_seed(seed + j)
        model = kind.model(channels, roi, (height, width))
        spec = FilterSpec(name=f"app{j:02d}", architecture=kind.architecture, tap=kind.tap, roi=roi, input_size=size)
        apps.append(Weights(spec, export_mc(model.eval(), crop)))
    return apps


def calibrated_specs(apps: list[Weights], base: BaseDNN, clip: Path, share: float) -> list[FilterSpec]:
    """The apps' specs on this base model, each threshold the (1 - share) quantile of its scores on the clip."""
    total = probe(clip, fps=CAMERA_FPS).n_frames
    wanted = set(np.linspace(0, total - 1, CALIBRATION_FRAMES).round().astype(int).tolist())
    specs = [app.spec.model_copy(update={"base_model": base.identity}) for app in apps]
    bank = MCBank(base.taps, base.input_size, base_model=base.identity)
    try:
        bank.put_many([(spec, app.onnx) for spec, app in zip(specs, apps, strict=True)])
        mcs, state = bank.active("calibration"), CameraState()
        scores = []
        for index, image in read_frames(clip, 0, max(wanted) + 1):
            if index in wanted:
                prepared = base.prepare(image)
                scores.append(bank.score(mcs, base.run(prepared, bank.needed_taps(mcs)), prepared, state))
    finally:
        bank.close()
    calibrated = []
    for spec in specs:
        threshold = float(np.clip(np.quantile([s[spec.name] for s in scores], 1 - share), 1e-6, 1 - 1e-6))
        calibrated.append(spec.model_copy(update={"smoothing": Smoothing(threshold=threshold)}))
    return calibrated


def camera_bundles(specs: list[FilterSpec], apps: list[Weights], cameras: int, folder: Path) -> dict[str, list[Path]]:
    """Per camera name, its own copies of the apps as filter bundles (`cameras: [name]`)."""
    bundles: dict[str, list[Path]] = {}
    for number in range(1, cameras + 1):
        name = camera_name(number)
        bundles[name] = [
            write_bundle(
                folder / f"{name}-{spec.name}",
                spec.model_copy(update={"name": f"{name}-{spec.name}", "cameras": [name]}),
                app.onnx,
            )
            for spec, app in zip(specs, apps, strict=True)
        ]
    return bundles


def camera_name(number: int) -> str:
    return f"cam-{number}"


# ---------------------------------------------------------------------------------------------------------
# One run of the edge


class BusyTimer:
    """Wraps a camera pipeline's process(): wall seconds the camera thread spent on its frames."""

    def __init__(self, pipeline: object) -> None:
        self.seconds = 0.0
        self._process = pipeline.process
        pipeline.process = self  # the node's camera thread calls pipeline.process(frame)

    def __call__(self, frame: object) -> object:
        started = time.perf_counter()
        try:
            return self._process(frame)
        finally:
            self.seconds += time.perf_counter() - started


@dataclass
class Counts:
    """A camera's counters at one moment (since the node started)."""

    frames: int
    skipped: int
    dropped: int
    matched: int
    base_s: float
    mc_s: float
    busy_s: float
    online: bool


def machine_cpu_seconds() -> float:
    """CPU seconds every process on the machine has used since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def snapshot(node: EdgeNode, timers: dict[str, BusyTimer]) -> tuple[float, float, float, dict[str, Counts]]:
    """(clock, this process's CPU seconds, the machine's CPU seconds, per camera counts)."""
    metrics = node.camera_metrics()
    counts = {
        name: Counts(
            frames=m["frames"],
            skipped=m["skipped"],
            dropped=m["dropped"],
            matched=m["matched"],
            base_s=node.pipelines[name].stats.base_seconds,
            mc_s=node.pipelines[name].stats.mc_seconds,
            busy_s=timers[name].seconds,
            online=m["online"],
        )
        for name, m in metrics.items()
    }
    return time.monotonic(), time.process_time(), machine_cpu_seconds(), counts


@dataclass
class CameraResult:
    """What one camera did after the warm-up."""

    name: str
    seconds: float
    frames: int  # processed (the base DNN ran, or the change gate reused the last scores)
    dropped: int  # frames the realtime source dropped (the edge fell behind)
    skipped: int  # frames the change gate skipped (scores reused, no base DNN)
    matched: int  # frame messages sent to the sink (a frame again when another filter's event start reaches it)
    base_s: float  # base DNN
    mc_s: float  # MC bank
    busy_s: float  # the camera thread's wall time in the pipeline (waits for the cores included)
    online: bool

    @property
    def fps(self) -> float:
        return self.frames / self.seconds

    @property
    def realtime(self) -> bool:
        return self.online and self.dropped == 0 and self.fps >= REALTIME_SHARE * CAMERA_FPS


def result_of(name: str, first: Counts, last: Counts, seconds: float) -> CameraResult:
    return CameraResult(
        name=name,
        seconds=seconds,
        frames=last.frames - first.frames,
        dropped=last.dropped - first.dropped,
        skipped=last.skipped - first.skipped,
        matched=last.matched - first.matched,
        base_s=last.base_s - first.base_s,
        mc_s=last.mc_s - first.mc_s,
        busy_s=last.busy_s - first.busy_s,
        online=last.online,
    )


@dataclass
class Run:
    """One edge run: a configuration, a number of cameras, what each camera did after the warm-up."""

    variant: str
    clip: str
    input_size: tuple[int, int]
    cameras: list[CameraResult]
    seconds: float  # measured (after the warm-up)
    startup_s: float  # building the node: base model, MC bank, sources
    cores: float  # CPU the whole process used over the measured seconds, in cores
    others: float  # CPU every other process on the machine used meanwhile, in cores
    load_before: float
    load_after: float
    problems: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.cameras)

    @property
    def realtime(self) -> bool:
        return not self.problems and all(camera.realtime for camera in self.cameras)

    @property
    def dropped(self) -> int:
        return sum(camera.dropped for camera in self.cameras)

    @property
    def dropped_share(self) -> float:
        """Dropped over what the cameras delivered (processed + dropped) after the warm-up."""
        return self.dropped / max(self.dropped + self.total("frames"), 1)

    def total(self, key: str) -> float:
        return sum(getattr(camera, key) for camera in self.cameras)

    def summary(self) -> dict:
        frames = max(self.total("frames"), 1)
        processed = max(frames - self.total("skipped"), 1)  # frames the base DNN ran on
        return {
            "variant": self.variant,
            "cameras": self.count,
            "input_size": list(self.input_size),
            "fps_min": min(c.fps for c in self.cameras),
            "fps_mean": self.total("fps") / self.count,
            "dropped": self.dropped,
            "skipped_share": self.total("skipped") / frames,
            "sends_per_frame": self.total("matched") / frames,
            "base_ms": 1000 * self.total("base_s") / processed,
            "mc_ms": 1000 * self.total("mc_s") / processed,
            "busy_ms": 1000 * self.total("busy_s") / frames,
            # resize, change gate, smoothing, H.264 of the matched frames, sink (and waits for the cores)
            "other_ms": 1000 * (self.total("busy_s") - self.total("base_s") - self.total("mc_s")) / frames,
            "cores": self.cores,
            # the process's CPU per camera frame (decoding included): what a camera costs, whatever else runs
            "cpu_ms_per_frame": 1000 * self.cores * self.seconds / frames,
            "others": self.others,
            "realtime": self.realtime,
        }


def run_edge(
    variant: Variant,
    model: Path | None,
    size: tuple[int, int],
    clips: Sequence[Path],
    bundles: dict[str, list[Path]],
    warmup: float,
    seconds: float,
) -> Run:
    """The real EdgeNode on `clips` (one camera each, realtime pacing at CAMERA_FPS) for warm-up + seconds."""
    names = [camera_name(number) for number in range(1, len(clips) + 1)]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ff-cameras-sink-") as sink:
        config = EdgeConfig(
            edge_id="bench-cameras",
            base_model=model,
            input_size=size,
            defaults=CameraDefaults(
                pacing="realtime",
                fps=CAMERA_FPS,
                change_gate=GateSettings(enabled=variant.gate),
                buffer_frames=variant.buffer,
            ),
            cameras=[CameraConfig(name=name, source=str(clip)) for name, clip in zip(names, clips, strict=True)],
            filters=[path for name in names for path in bundles[name]],
            sink=SinkConfig(path=Path(sink)),
            stats_interval=STATS_NEVER,
        )
        started = time.monotonic()
        node = EdgeNode(config)
        startup = time.monotonic() - started
        timers = {name: BusyTimer(pipeline) for name, pipeline in node.pipelines.items()}
        thread = threading.Thread(target=node.run, name="edge-node", daemon=True)
        thread.start()
        try:
            time.sleep(warmup)
            t0, cpu0, machine0, first = snapshot(node, timers)
            time.sleep(seconds)
            t1, cpu1, machine1, last = snapshot(node, timers)
        finally:
            node.stop()
            thread.join(timeout=120)
    measured = t1 - t0
    cameras = [result_of(name, first[name], last[name], measured) for name in names]
    return Run(
        variant=variant.name,
        clip=clips[0].name,
        input_size=size,
        cameras=cameras,
        seconds=measured,
        startup_s=startup,
        cores=(cpu1 - cpu0) / measured,
        others=max(0.0, (machine1 - machine0 - (cpu1 - cpu0)) / measured),
        load_before=load_before,
        load_after=os.getloadavg()[0],
        problems=node.problems(),
    )


# ---------------------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class Settings:
    data: Path
    max_cameras: int
    seconds: float
    warmup: float
    mcs: int
    match_share: float
    stop_share: float
    variants: tuple[Variant, ...]
    hd_sizes: tuple[tuple[int, int], ...]
    taps: tuple[str, ...]  # the filters' taps, in turn
    seed: int
    json: Path
    out: Path

    @property
    def clip_frames(self) -> int:
        """Frames per camera clip: the run, plus slack for start-up and stopping."""
        return math.ceil((self.warmup + self.seconds + 10) * CAMERA_FPS)


@dataclass
class Setup:
    """Per model_key (precision, clip, input size): the base model file (None: the default fp32), the cameras'
    filter bundles and the filters' thresholds."""

    models: dict[str, Path | None]
    bundles: dict[str, dict[str, list[Path]]]  # per camera name, its filter bundles
    thresholds: dict[str, list[float]]


def export_reduced(precision: str, clip: Path, size: tuple[int, int]) -> Path:
    """The base model at `precision`, int8 calibrated on the clip's camera at `size` (exported once, then kept in
    the cache; bf16 needs no calibration)."""
    out = cache_dir("bench", "cameras") / f"efficientnet_lite0-{precision}-{clip.parent.name}-{size[0]}x{size[1]}.onnx"
    return export_precision(precision, out, [clip.parent], DEFAULT_CALIBRATION_FRAMES, size)


def prepare(settings: Settings, work: Path, hd_source: Path | None) -> Setup:
    """Base models and filter bundles for every (precision, input size) the plan runs."""
    car = settings.data / CAR
    precisions = sorted({variant.precision for variant in settings.variants})
    jobs = [(car, SIZE, settings.max_cameras)] + [(hd_source, size, 1) for size in settings.hd_sizes if hd_source]
    setup = Setup({}, {}, {})
    for clip, size, cameras in jobs:
        apps = app_weights(size, settings.mcs, settings.seed, settings.taps)
        for precision in precisions:
            key = model_key(precision, clip, size)
            if precision == "fp32":
                model = None
            else:  # reduced precision (int8 calibrated on this camera's clip), at its first input size
                first = SIZE if clip == car else settings.hd_sizes[0]
                model = export_reduced(precision, clip, first)
            setup.models[key] = model
            log.info("calibrating %d filters at %dx%d on %s (%s)", len(apps), *size, clip.parent.name, precision)
            base = BaseDNN(size, model)
            specs = calibrated_specs(apps, base, clip, settings.match_share)
            del base
            setup.thresholds[key] = [spec.smoothing.threshold for spec in specs]
            setup.bundles[key] = camera_bundles(specs, apps, cameras, work / "filters" / key.replace(" ", "-"))
            if any(variant.veto for variant in settings.variants):
                vetoed = [spec.model_copy(update={"motion": MOTION_VETO}) for spec in specs]
                folder = work / "filters" / f"{key}{VETO}".replace(" ", "-")
                setup.bundles[key + VETO] = camera_bundles(vetoed, apps, cameras, folder)
    return setup


def model_key(precision: str, clip: Path, size: tuple[int, int]) -> str:
    return f"{precision} {clip.parent.name} {size[0]}x{size[1]}"


def bundles_of(setup: Setup, variant: Variant, key: str) -> dict[str, list[Path]]:
    """The filter bundles a configuration runs: those of its base model, with motion vetoes for '+veto'."""
    return setup.bundles[key + VETO if variant.veto else key]


def race(settings: Settings, setup: Setup, clips: list[Path]) -> list[Run]:
    """N = 1, 2, ... cameras; each N runs every configuration that has kept up so far, in a rotating order."""
    car = settings.data / CAR
    runs: list[Run] = []
    racing = list(settings.variants)
    for count in range(1, settings.max_cameras + 1):
        shift = (count - 1) % len(racing)
        for variant in racing[shift:] + racing[:shift]:
            key = model_key(variant.precision, car, SIZE)
            run = run_edge(
                variant, setup.models[key], SIZE, clips[:count], bundles_of(setup, variant, key), settings.warmup,
                settings.seconds,
            )  # fmt: skip
            runs.append(run)
            log_run(run)
        # A configuration stays in the race while it drops at most stop_share: one stray drop on a shared
        # machine does not end its curve (the summary still counts 0 dropped strictly).
        racing = [v for v in racing if next(r for r in reversed(runs) if r.variant == v.name).dropped_share
                  <= settings.stop_share]  # fmt: skip
        if not racing:
            break
    return runs


def hd_runs(settings: Settings, setup: Setup, clip: Path, source: Path) -> list[Run]:
    """One 1080p camera (`clip`, a loop of `source`) per input size and configuration."""
    runs = []
    for size in settings.hd_sizes:
        for variant in settings.variants:
            key = model_key(variant.precision, source, size)
            run = run_edge(
                variant,
                setup.models[key],
                size,
                [clip],
                bundles_of(setup, variant, key),
                settings.warmup,
                settings.seconds,
            )
            runs.append(run)
            log_run(run)
    return runs


def log_run(run: Run) -> None:
    s = run.summary()
    log.info(
        "%s, %d camera(s) at %dx%d: fps min %.2f, dropped %d, skipped %.0f%%, base %.1f ms, %.2f cores (others"
        " %.2f)%s",
        run.variant, run.count, *run.input_size, s["fps_min"], run.dropped, 100 * s["skipped_share"], s["base_ms"],
        run.cores, run.others, "" if run.realtime else "  (falls behind)",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Report


def most_cameras(runs: list[Run], variant: str, share: float | None = None) -> int:
    """The largest N this configuration served in real time (or, given `share`, dropping at most that share of
    the frames), every smaller N included."""
    best = 0
    for run in sorted((r for r in runs if r.variant == variant), key=lambda r: r.count):
        if not (run.realtime if share is None else run.dropped_share <= share):
            break
        best = run.count
    return best


def summarise(runs: list[Run], settings: Settings) -> dict[str, dict]:
    reference = most_cameras(runs, settings.variants[0].name)
    one = {r.variant: r.summary() for r in runs if r.count == 1}
    base_reference = one.get(settings.variants[0].name, {}).get("base_ms")
    summary = {}
    cpus = os.cpu_count() or 1
    for variant in settings.variants:
        mine = [r.summary()["cpu_ms_per_frame"] for r in runs if r.variant == variant.name]
        cpu_ms = float(np.median(mine)) if mine else None
        best = most_cameras(runs, variant.name)
        at_best = next((r for r in runs if r.variant == variant.name and r.count == best), None)
        first = one.get(variant.name, {})
        summary[variant.name] = {
            "max_cameras": best,
            "max_cameras_1pct": most_cameras(runs, variant.name, LOOSE_SHARE),
            "dropped_share": {r.count: r.dropped_share for r in runs if r.variant == variant.name},
            "capped": best == settings.max_cameras,  # it never fell behind: the real limit is higher
            "vs_first": best / reference if reference else None,
            "base_ms_1": first.get("base_ms"),
            "base_speedup": base_reference / first["base_ms"] if base_reference and first.get("base_ms") else None,
            "skipped_share_1": first.get("skipped_share"),
            "cores_at_max": at_best.cores if at_best else None,
            "busy_ms_at_max": at_best.summary()["busy_ms"] if at_best else None,
            "cpu_ms_per_frame": cpu_ms,
            # the cameras the machine's cores would serve with nothing else running, from the CPU a frame costs:
            # an upper bound (no stall may outlast the camera's queue), for runs on a machine others share
            "cpu_bound_cameras": int(cpus * 1000 / (cpu_ms * CAMERA_FPS)) if cpu_ms else None,
        }
    return summary


def print_runs(title: str, runs: list[Run]) -> None:
    width = column_width(run.variant for run in runs)
    print(f"\n{title}")
    print(
        f"{'config':<{width}} {'N':>2} {'input':>9} {'fps min':>8} {'mean':>6} {'dropped':>8} {'skipped':>8}"
        f" {'sends':>6} {'base ms':>8} {'MC ms':>6} {'other ms':>8} {'cores':>6} {'others':>6}  real time"
    )
    for run in runs:
        s = run.summary()
        size = "x".join(map(str, run.input_size))
        print(
            f"{run.variant:<{width}} {run.count:>2} {size:>9} {s['fps_min']:>8.2f} {s['fps_mean']:>6.2f}"
            f" {run.dropped:>8d} {s['skipped_share']:>8.0%} {s['sends_per_frame']:>6.2f} {s['base_ms']:>8.1f}"
            f" {s['mc_ms']:>6.2f} {s['other_ms']:>8.1f} {run.cores:>6.2f} {run.others:>6.2f}"
            f"  {'yes' if run.realtime else 'NO'}" + (f"  ({'; '.join(run.problems)})" if run.problems else "")
        )


def column_width(names: Iterable[str]) -> int:
    """The config column's width: the longest name ('int8+gate@16'), at least the default names' 10."""
    return max([10, *map(len, names)])


def fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def print_summary(summary: dict[str, dict], settings: Settings) -> None:
    first = settings.variants[0].name
    width = column_width(summary)
    print(f"\ncameras served in real time (0 dropped after the warm-up, every smaller N too), ratios against {first}")
    print(
        f"{'config':<{width}} {'max N':>6} {'vs ' + first:>9} {'N <=1% dropped':>15} {'base ms (N=1)':>14}"
        f" {'base speedup':>13} {'skipped (N=1)':>14} {'CPU ms/frame':>13} {'CPU-bound N':>12}"
    )
    for name, s in summary.items():
        capped = ">=" if s["capped"] else ""
        print(
            f"{name:<{width}} {capped + str(s['max_cameras']):>6} {fmt(s['vs_first'], '.2f') + 'x':>9}"
            f" {s['max_cameras_1pct']:>15d} {fmt(s['base_ms_1'], '.1f'):>14}"
            f" {fmt(s['base_speedup'], '.2f') + 'x':>13} {fmt(s['skipped_share_1'], '.0%'):>14}"
            f" {fmt(s['cpu_ms_per_frame'], '.1f'):>13} {fmt(s['cpu_bound_cameras'], 'd'):>12}"
        )
    print(
        "target (issue 12): >= 4 cameras with 0 dropped; '>=': the run stopped at --max-cameras; CPU ms/frame: the"
        " process's CPU per camera frame (median over the runs); CPU-bound N: the machine's cores over what a camera"
        " costs, an upper bound with nothing else running"
    )
    counts = range(1, settings.max_cameras + 1)
    print("\nshare of frames dropped after the warm-up, per number of cameras")
    print(f"{'config':<{width}}" + "".join(f" {'N=' + str(n):>6}" for n in counts))
    for name, s in summary.items():
        shares = s["dropped_share"]
        print(f"{name:<{width}}" + "".join(f" {fmt(shares.get(n), '.1%'):>6}" for n in counts))


def hd_defaults(frame_size: tuple[int, int]) -> dict[str, object]:
    """Where a 1080p camera's input size comes from by default."""
    return {
        "frame_size": list(frame_size),
        "train_default": list(default_input_size(frame_size)),  # filterforward train without --input-size
        "edge_config_default": list(EdgeConfig.model_fields["input_size"].default),
    }


def plot(runs: list[Run], hd: list[Run], settings: Settings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if hd else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    top = max((r.count for r in runs), default=1)
    axes[0].plot([1, top], [CAMERA_FPS, CAMERA_FPS * top], ":", color="grey", label="every frame")
    for variant in settings.variants:
        mine = sorted((r for r in runs if r.variant == variant.name), key=lambda r: r.count)
        if not mine:
            continue
        line = axes[0].plot([r.count for r in mine], [r.total("fps") for r in mine], "o-", label=variant.name)[0]
        behind = [r for r in mine if not r.realtime]
        axes[0].plot([r.count for r in behind], [r.total("fps") for r in behind], "x", color=line.get_color(), ms=10)
        share = [r.dropped / max(r.dropped + r.total("frames"), 1) for r in mine]
        axes[1].plot([r.count for r in mine], [100 * s for s in share], "o-", label=variant.name)
    axes[0].set(xlabel="cameras (768x432, 12.5 fps, 10 MCs each)", ylabel="frames/s processed (all cameras)",
                title="throughput (x: frames dropped)")  # fmt: skip
    axes[1].set(xlabel="cameras", ylabel="% of frames dropped", title="dropped after the warm-up")
    for axis in axes[:2]:
        axis.set_xticks(range(1, top + 1))
        axis.set_ylim(bottom=0)
        axis.legend()
    if hd:
        labels = [f"{r.variant} {r.input_size[0]}x{r.input_size[1]}" for r in hd]
        axes[2].bar(range(len(hd)), [r.total("fps") for r in hd], color=["C2" if r.realtime else "C3" for r in hd])
        axes[2].axhline(CAMERA_FPS, color="grey", linestyle=":")
        axes[2].set_xticks(range(len(hd)), labels, fontsize=7, rotation=30, ha="right")
        axes[2].set(ylabel="frames/s processed", title="one 1080p camera at 12.5 fps (green: real time)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------------------------------------
# Main


def default_data() -> Path:
    env = os.environ.get("FILTERFORWARD_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def variant_named(text: str) -> Variant:
    """A configuration by name, with '+veto' for filters with a motion veto and '@F' for F frames queued per camera
    (int8+gate+veto@2)."""
    name, _, frames = text.partition("@")
    veto = name.endswith(VETO)
    name = name.removesuffix(VETO)
    by_name = {v.name: v for v in VARIANTS}
    if name not in by_name:
        raise ValueError(f"unknown configuration {name!r}; use {', '.join(by_name)}, each optionally with {VETO}")
    if frames and (not frames.isdigit() or int(frames) < 1):
        raise ValueError(f"configuration {text!r}: the frames after '@' must be a whole number >= 1")
    variant = replace(by_name[name], name=text, veto=veto)
    return replace(variant, buffer=int(frames)) if frames else variant


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: up to 2 cameras, 5 s after a 2 s warm-up")
    parser.add_argument("--max-cameras", type=int, default=8, help="stop growing N here (default 8)")
    parser.add_argument("--seconds", type=float, help="measured seconds per run (default 20; --quick 5)")
    parser.add_argument("--warmup", type=float, help="seconds per run before measuring (default 5; --quick 2)")
    parser.add_argument("--mcs", type=int, default=10, help="filters per camera (default 10)")
    parser.add_argument(
        "--match-share", type=float, default=0.05, help="share of frames each filter passes on its clip (default 0.05)"
    )
    parser.add_argument(
        "--stop-share",
        type=float,
        default=0.02,
        help="a configuration leaves the race once a run drops more than this share of the frames (default 0.02)",
    )
    parser.add_argument(
        "--configs",
        default=DEFAULT_VARIANTS,
        help=f"configurations, the first the reference (default {DEFAULT_VARIANTS}; also bf16, bf16+gate; "
        "NAME+veto: every filter with a motion veto; NAME@F: each camera queues F frames instead of the edge's own)",
    )
    parser.add_argument(
        "--hd-sizes",
        default="default,half",
        help="input sizes for the 1080p camera: WxH, default (what a 1080p camera gets by default), half, or none",
    )
    parser.add_argument(
        "--taps",
        default=",".join(TAPS),
        help=f"the filters' taps, in turn (default {','.join(TAPS)}, the default filter's candidates; mid: the base "
        "DNN runs only up to mid)",
    )
    parser.add_argument("--data", type=Path, default=default_data(), help="the shared data folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "out" / "cameras.json")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for cameras.png")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_cameras = min(args.max_cameras, 2)
        args.hd_sizes = "default" if args.hd_sizes == "default,half" else args.hd_sizes
    args.seconds = args.seconds or (5.0 if args.quick else 20.0)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 5.0)
    try:
        variants = tuple(variant_named(name) for name in args.configs.split(","))
    except ValueError as exc:
        parser.error(str(exc))
    hd_size = default_input_size((1920, 1080))
    named = {"default": hd_size, "half": round_input_size((hd_size[0] // 2, hd_size[1] // 2))}
    hd_sizes = () if args.hd_sizes == "none" else tuple(
        named.get(text) or parse_size(text) for text in args.hd_sizes.split(",")
    )  # fmt: skip
    return Settings(
        data=args.data,
        max_cameras=args.max_cameras,
        seconds=args.seconds,
        warmup=args.warmup,
        mcs=args.mcs,
        match_share=args.match_share,
        stop_share=args.stop_share,
        variants=variants,
        hd_sizes=hd_sizes,
        taps=tuple(args.taps.split(",")),
        seed=args.seed,
        json=args.json,
        out=args.out,
    )


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("edge", "models"):  # a line per event and per filter otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    settings = parse_args(argv)
    car, hd = settings.data / CAR, settings.data / HD
    for clip in [car] + ([hd] if settings.hd_sizes else []):
        if not clip.is_file():
            raise SystemExit(f"{clip} not found: pass --data or set FILTERFORWARD_DATA")
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    ensure_base_model()
    clips_folder = cache_dir("bench", "cameras", "clips")
    log.info("encoding %d looped camera clips of %d frames", settings.max_cameras, settings.clip_frames)
    clips = camera_clips(car, settings.max_cameras, settings.clip_frames, CRF["car"], clips_folder)
    hd_clip = looped_clip(hd, 0, settings.clip_frames, CRF["hd"], clips_folder) if settings.hd_sizes else None
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ff-cameras-") as work:
        setup = prepare(settings, Path(work), hd if settings.hd_sizes else None)
        log.info("racing %s on up to %d cameras", ", ".join(v.name for v in settings.variants), settings.max_cameras)
        runs = race(settings, setup, clips)
        hd_results = hd_runs(settings, setup, hd_clip, hd) if hd_clip else []
    meta = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_start": load_start,
        "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "minutes": (time.monotonic() - started) / 60,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "camera_fps": CAMERA_FPS,
        "clip": str(CAR),
        "input_size": list(SIZE),
        "hd_clip": str(HD),
        "hd_defaults": hd_defaults((1920, 1080)),
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k not in ("data", "json", "out", "variants", "hd_sizes")},
            "variants": [asdict(v) for v in settings.variants],
            "hd_sizes": [list(size) for size in settings.hd_sizes],
        },
        "thresholds": setup.thresholds,
    }
    summary = summarise(runs, settings)
    print(
        f"\ncameras: the real EdgeNode, realtime pacing, {settings.mcs} MCs per camera, {settings.warmup:g} s warm-up +"
        f" {settings.seconds:g} s per run; {meta['cpus']} CPUs, load average {load_start} at the start,"
        f" {meta['load_end']} at the end; {meta['minutes']:.1f} min"
    )
    print_runs(f"car clip {CAR.name} (768x432, looped, a start frame per camera) at {SIZE[0]}x{SIZE[1]}", runs)
    print_summary(summary, settings)
    if hd_results:
        d = meta["hd_defaults"]
        print_runs(f"one 1080p camera ({HD.name}, looped at {CAMERA_FPS:g} fps)", hd_results)
        print(
            f"a 1920x1080 camera's default input size: {d['train_default'][0]}x{d['train_default'][1]} (filterforward"
            f" train scales the frame down to at most 768x448 pixels; the edge runs its filters' size); the edge"
            f" config's own default is {d['edge_config_default'][0]}x{d['edge_config_default'][1]}"
        )
    record = {
        "meta": meta,
        "summary": summary,
        "runs": [{**r.summary(), **asdict(r)} for r in runs],
        "hd": [{**r.summary(), **asdict(r)} for r in hd_results],
    }
    settings.json.parent.mkdir(parents=True, exist_ok=True)
    settings.json.write_text(json.dumps(record, indent=2, default=str))
    settings.out.mkdir(parents=True, exist_ok=True)
    plot(runs, hd_results, settings, settings.out / "cameras.png")
    print(f"wrote {settings.json} and {settings.out / 'cameras.png'}")


if __name__ == "__main__":
    try:
        main()
    except FilterForwardError as error:
        sys.exit(f"error: {error}")
