"""Benchmark: frames/s of the full edge pipeline as microclassifiers (MCs) or discrete classifiers are added.

One process, one clip, one input size. The clip is decoded once up front (decode is reported on its own)
and the same frames are replayed through `CameraPipeline` (base DNN -> MC bank -> smoothing -> JPEG
-> a sink that discards) for every configuration: 1, 10 and 50 MCs of each kind (full_frame on `late`,
localized and windowed on `mid`, a mixed fleet cycling the three, and the default filter as `filterforward train`
ships it: an ensemble of three full_frame members on `mid`, one graph, over a region and its context cells), and
1, 10 and 50 NoScope-style discrete classifiers on pixels. The configurations take turns of ten consecutive
frames in a rotating order, every frame is timed several times and the median kept, so a noisy shared machine
slows every configuration alike. See bench/README.md for the columns and the targets.

    python bench/mc_scaling.py            # the default run (about 2 minutes on 2 idle cores)
    python bench/mc_scaling.py --quick    # a smoke run (seconds)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import onnxruntime as ort
from tqdm import tqdm

from common.fragment import Fragment
from edge.mcbank import CameraState, MCBank
from edge.pipeline import CameraPipeline
from edge.sink import MatchedFrame
from edge.sources import Frame, open_source
from models.basednn import BaseDNN
from models.errors import FilterForwardError
from models.filterspec import Encoding, FilterSpec, Smoothing
from models.mc_kinds import MCWeights, auto_context
from models.microclassifiers import Ensemble, MicroClassifier, build_mc
from models.model_selection import ENSEMBLE
from models.roi import FULL_FRAME, ROI
from models.smoother import Event
from models.taps import PIXEL_TAP, PIXELS, Tap, check_input_size

log = logging.getLogger("bench.mc_scaling")

REPO = Path(__file__).resolve().parents[1]
CLIP = Path("intel-car-detection") / "car-detection.mp4"
CAMERA = "bench"
WINDOW = 5
SMOOTHING_K, SMOOTHING_N = 3, 5
# A random MC's threshold is this quantile of its own scores on the clip, so it passes about 30% of the
# frames and k-of-N smoothing, events and JPEG encoding stay in the timed path.
THRESHOLD_QUANTILE = 0.7
# The boxes a fleet's applications watch (normalised x0, y0, x1, y1); MC i and discrete classifier i get
# box i mod 5, so a discrete classifier is compared with the MC of the same application.
ROI_BOXES = (
    ROI(),
    ROI(x0=0.0, y0=0.0, x1=0.5, y1=1.0),
    ROI(x0=0.5, y0=0.0, x1=1.0, y1=1.0),
    ROI(x0=0.25, y0=0.25, x1=0.75, y1=0.75),
    ROI(x0=0.0, y0=0.5, x1=1.0, y1=1.0),
)
TARGETS = {"fps_ratio": 0.8, "marginal_ratio": 20.0, "break_even": 2}


@dataclass(frozen=True)
class Kind:
    """A row group of the table: one classifier architecture on one tap (`ensemble` members in one graph, regions
    read with `context` cells around them: the default filter)."""

    name: str
    architecture: str
    tap: str
    ensemble: int = 1
    context: int | None = 0  # None: the default filter's at the input size (models.mc_kinds.auto_context)

    def roi_boxes(self, input_size: tuple[int, int]) -> tuple[ROI, ...]:
        context = auto_context(input_size) if self.context is None else self.context
        if context:
            return tuple(roi.with_context(context) for roi in ROI_BOXES)
        return (FULL_FRAME,) if self.architecture == "full_frame" else ROI_BOXES

    def model(self, channels: int, roi: ROI, tap_hw: tuple[int, int]) -> MicroClassifier:
        """A random-initialised classifier of this kind on the ROI's crop of a tap of `tap_hw` cells."""
        crop_hw, mask = roi.cell_shape(*tap_hw), roi.cell_mask(*tap_hw)
        members = [
            build_mc(self.architecture, channels, crop_hw, WINDOW, mask, roi.context) for _ in range(self.ensemble)
        ]
        return members[0] if len(members) == 1 else Ensemble(members)


PAPER_KINDS = (
    Kind("full_frame", "full_frame", "late"),
    Kind("localized", "localized", "mid"),
    Kind("windowed", "windowed", "mid"),
)
DEFAULT_FILTER = Kind("default", "full_frame", "mid", ENSEMBLE, context=None)
MC_KINDS = (*PAPER_KINDS, DEFAULT_FILTER)
MIXED = "mixed"  # a fleet cycling the paper's kinds
DISCRETE = Kind("discrete", "discrete", PIXELS)


@dataclass
class DiscardSink:
    """Counts what the pipeline sends and throws it away (no disk or network in the timed path)."""

    sends: int = 0  # MatchedFrame messages (a frame can be sent more than once, for different filters)
    indices: set[int] = field(default_factory=set)  # distinct frames sent

    def frame(self, matched: MatchedFrame) -> None:
        self.sends += 1
        self.indices.add(matched.index)

    def event(self, kind: Literal["start", "end"], event: Event, clip: bytes | None = None) -> None:
        pass

    def fragment(self, camera: str, fragment: Fragment) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class Filter:
    """A classifier as the cloud would hand it to the edge: its spec and its ONNX weights."""

    spec: FilterSpec
    onnx: bytes


@dataclass
class Config:
    """One configuration (a pipeline with `count` classifiers of one kind) and its per-frame timings."""

    kind: str
    count: int
    pipeline: CameraPipeline
    sink: DiscardSink
    samples: np.ndarray  # (repeats, frames, 3): seconds of the whole frame, of the base DNN, of the MC bank
    next_index: int = 0  # the pipeline's next frame index: smoothers need increasing indices across replays
    first_timed: int = 0
    sends_before_timing: int = 0

    def process(self, image: np.ndarray, fps: float) -> tuple[float, float, float]:
        """Push one frame through the pipeline; its seconds in total, in the base DNN and in the MC bank."""
        stats = self.pipeline.stats
        base, mcs = stats.base_seconds, stats.mc_seconds
        started = time.perf_counter()
        self.pipeline.process(Frame(self.next_index, self.next_index / fps, image))
        total = time.perf_counter() - started
        self.next_index += 1
        return total, stats.base_seconds - base, stats.mc_seconds - mcs

    def warm_up(self, frames: Sequence[Frame], fps: float) -> None:
        for frame in frames:
            self.process(frame.image, fps)
        self.first_timed, self.sends_before_timing = self.next_index, self.sink.sends

    def close(self) -> None:
        self.pipeline.end_events()
        self.pipeline.bank.close()  # stops the bank's worker threads


@dataclass(frozen=True)
class Settings:
    """What to run, from the command line."""

    video: Path
    input_size: tuple[int, int]
    frames: int
    counts: tuple[int, ...]
    repeats: int
    warmup: int
    block: int  # consecutive frames per configuration's turn
    threads: int | None
    seed: int
    out: Path
    base_model: Path | None = None  # default: the fp32 EfficientNet-Lite0 export
    mc_weights: MCWeights = "fp32"  # of the fused MC graphs' FC layers, as the edge's `mc_weights`


# ---------------------------------------------------------------------------------------------------------
# Setup: frames, fleets, thresholds


def decode_frames(video: Path, count: int) -> tuple[list[Frame], float, float]:
    """The first `count` frames of the clip, the decode time per frame in ms, and the clip's fps."""
    frames: list[Frame] = []
    started = time.perf_counter()
    with open_source(str(video), pacing="every-frame") as source:
        for frame in source:
            frames.append(frame)
            if len(frames) == count:
                break
        fps = source.fps or 25.0
    decode_ms = 1000 * (time.perf_counter() - started) / max(len(frames), 1)
    if len(frames) < count:
        raise FilterForwardError(f"{video} has only {len(frames)} frames but --frames is {count}: lower --frames")
    return frames, decode_ms, fps


def tap_of(kind: Kind, base: BaseDNN) -> Tap:
    return PIXEL_TAP if kind.tap == PIXELS else base.taps[kind.tap]


def build_fleet(kind: Kind, count: int, base: BaseDNN, seed: int) -> list[Filter]:
    """`count` random-initialised classifiers of one kind, each its own instance, on cycling ROIs."""
    import torch

    from models.mc_export import export_mc

    channels, height, width = tap_of(kind, base).shape(base.input_size)
    fleet, boxes = [], kind.roi_boxes(base.input_size)
    for i in range(count):
        roi = boxes[i % len(boxes)]
        crop = (channels, *roi.cell_shape(height, width))
        torch.manual_seed(seed + i)
        model = kind.model(channels, roi, (height, width))
        spec = FilterSpec(
            name=f"{kind.name}-{i:03d}",
            architecture=kind.architecture,
            tap=kind.tap,
            roi=roi,
            input_size=base.input_size,
            window=WINDOW,
            encoding=Encoding(kind="jpeg"),  # a JPEG per matched frame on the timed thread, as the method says
        )
        fleet.append(Filter(spec, export_mc(model, crop)))
    return fleet


def calibrate(fleet: list[Filter], base: BaseDNN, prepared: Sequence[np.ndarray], taps: Sequence[dict]) -> list[Filter]:
    """The fleet with each threshold set to THRESHOLD_QUANTILE of its own scores on the frames."""
    bank = MCBank(base.taps, base.input_size)
    for member in fleet:
        bank.put(member.spec, member.onnx)
    mcs = bank.active(CAMERA)
    state = CameraState()
    scores = [bank.score(mcs, frame_taps, image, state) for image, frame_taps in zip(prepared, taps, strict=True)]
    bank.close()
    calibrated = []
    for member in fleet:
        threshold = float(np.quantile([s[member.spec.name] for s in scores], THRESHOLD_QUANTILE))
        smoothing = Smoothing(threshold=float(np.clip(threshold, 1e-6, 1 - 1e-6)), k=SMOOTHING_K, n=SMOOTHING_N)
        calibrated.append(Filter(member.spec.model_copy(update={"smoothing": smoothing}), member.onnx))
    return calibrated


def mixed_fleet(fleets: dict[str, list[Filter]], count: int) -> list[Filter]:
    """The first `count` of a fleet that cycles full_frame, localized, windowed."""
    kinds = [kind.name for kind in PAPER_KINDS]
    return [fleets[kinds[i % len(kinds)]][i // len(kinds)] for i in range(count)]


def make_config(kind: str, fleet: list[Filter], base: BaseDNN, fps: float, settings: Settings) -> Config:
    bank = MCBank(base.taps, base.input_size, weights=settings.mc_weights)
    for member in fleet:
        bank.put(member.spec, member.onnx)
    sink = DiscardSink()
    pipeline = CameraPipeline(CAMERA, base, bank, sink, fps)
    return Config(kind, len(fleet), pipeline, sink, np.zeros((settings.repeats, settings.frames, 3)))


def build_configs(settings: Settings, base: BaseDNN, frames: Sequence[Frame], fps: float) -> list[Config]:
    """Every (kind, count) configuration, its classifiers exported and calibrated on the frames."""
    largest = max(settings.counts)
    prepared = [base.prepare(frame.image) for frame in frames]
    taps = [base.run(image, {kind.tap for kind in MC_KINDS}) for image in prepared]
    fleets = {}
    for kind in (*MC_KINDS, DISCRETE):  # the mixed fleet reuses members of the paper kinds' fleets
        log.info("exporting and calibrating %d %s classifiers", largest, kind.name)
        fleets[kind.name] = calibrate(build_fleet(kind, largest, base, settings.seed), base, prepared, taps)
    groups = [*(kind.name for kind in MC_KINDS), MIXED, DISCRETE.name]
    configs = []
    for group in groups:
        for count in settings.counts:
            fleet = mixed_fleet(fleets, count) if group == MIXED else fleets[group][:count]
            configs.append(make_config(group, fleet, base, fps, settings))
    return configs


def classifier_macs(kind: Kind, tap: Tap, input_size: tuple[int, int]) -> float:
    """Multiply-accumulates of one classifier of this kind, averaged over the ROI boxes it cycles through."""
    from models.microclassifiers import count_macs

    channels, height, width = tap.shape(input_size)
    total, boxes = 0, kind.roi_boxes(input_size)
    for roi in boxes:
        crop = (channels, *roi.cell_shape(height, width))
        model = kind.model(channels, roi, (height, width))
        total += count_macs(model, model.example_inputs(crop))
    return total / len(boxes)


def base_macs(input_size: tuple[int, int], tap: str) -> int:
    """Multiply-accumulates of EfficientNet-Lite0 up to `tap` (the default base model)."""
    import torch
    from torch import nn

    from models.efficientnet_lite import TAP_BLOCKS, EfficientNetLite0
    from models.microclassifiers import count_macs

    net = EfficientNetLite0()
    trunk = nn.Sequential(net.stem, *net.blocks[: TAP_BLOCKS[tap] + 1])
    width, height = input_size
    return count_macs(trunk, (torch.zeros(1, 3, height, width),))


def compute_floor(base: BaseDNN) -> dict[str, dict]:
    """The timing-free view: millions of MACs per classifier against the base DNN, per kind.

    The base is counted up to the deepest tap the kind reads; MC ratios and break-even follow from MACs alone.
    """
    mmacs = {kind.name: classifier_macs(kind, tap_of(kind, base), base.input_size) / 1e6 for kind in MC_KINDS}
    mmacs[MIXED] = statistics.mean(mmacs[kind.name] for kind in PAPER_KINDS)
    discrete = classifier_macs(DISCRETE, PIXEL_TAP, base.input_size) / 1e6
    deepest = {kind.name: kind.tap for kind in MC_KINDS}
    deepest[MIXED] = max((kind.tap for kind in PAPER_KINDS), key=lambda tap: base.taps[tap].stride)
    floor: dict[str, dict] = {DISCRETE.name: {"mmacs": discrete}}
    for kind, mc in mmacs.items():
        base_mmacs = base_macs(base.input_size, deepest[kind]) / 1e6
        floor[kind] = {
            "mmacs": mc,
            "base_mmacs": base_mmacs,
            "pct_of_base": 100 * mc / base_mmacs,
            "discrete_ratio": discrete / mc,
            "break_even": break_even(base_mmacs, mc, discrete),
        }
    return floor


# ---------------------------------------------------------------------------------------------------------
# Timing


def run_all(configs: list[Config], frames: Sequence[Frame], fps: float, settings: Settings) -> None:
    """Time every configuration on every frame, `repeats` times.

    The frames go through the configurations in turns of `block` consecutive frames, one configuration after the
    other in a rotating order, so a burst of load from other processes lands on all of them alike instead of on
    one whole row, while each configuration runs several frames in a row, as an edge runs its one bank on every
    frame. With one frame per turn every frame would find the caches full of the other 14 configurations' weights:
    that costs the bank nothing next to the fp32 base DNN, which evicts it anyway, but about 2 ms for 50 full_frame
    MCs next to the int8 one (bench README).
    """
    for config in configs:
        config.warm_up(frames[: settings.warmup], fps)
    starts = range(0, len(frames), settings.block)
    rounds = [(repeat, start) for repeat in range(settings.repeats) for start in starts]
    for turn, (repeat, start) in enumerate(tqdm(rounds, desc="timing", unit="turn", file=sys.stderr)):
        for i in range(len(configs)):
            config = configs[(i + turn) % len(configs)]
            for f in range(start, min(start + settings.block, len(frames))):
                config.samples[repeat, f] = config.process(frames[f].image, fps)
    for config in configs:
        config.close()


# ---------------------------------------------------------------------------------------------------------
# Results


def row_of(config: Config) -> dict:
    """Per-frame medians over the repeats, averaged over the frames (in ms)."""
    total, base, mcs = 1000 * np.median(config.samples, axis=0).mean(axis=0)
    timed = config.next_index - config.first_timed
    return {
        "kind": config.kind,
        "count": config.count,
        "fps": 1000 / total,
        "ms_per_frame": total,
        "base_ms": base,
        "mc_ms": mcs,
        "other_ms": total - base - mcs,
        "matched_fraction": sum(i >= config.first_timed for i in config.sink.indices) / timed,
        "sends_per_frame": (config.sink.sends - config.sends_before_timing) / timed,
        "repeats_ms_per_frame": (1000 * config.samples[:, :, 0].mean(axis=1)).tolist(),
    }


def break_even(base_ms: float, mc_marginal: float, discrete_marginal: float) -> int | None:
    """Smallest N with base + N * mc_marginal < N * discrete_marginal; None if MCs never catch up."""
    gap = discrete_marginal - mc_marginal
    if gap <= 0:
        return None
    return int(base_ms // gap) + 1


def summarise(rows: list[dict], counts: tuple[int, ...]) -> dict:
    """Per kind: fps ratios, marginal cost of one more classifier, and the comparison with discrete ones.

    A kind's base DNN does the same work whatever the number of classifiers, so its marginal cost is the
    growth of the rest of the frame's time (MC bank, smoothing, encoding), and the base-pooled fps ratio
    uses the kind's median base-DNN time for every count: both keep base-DNN timing noise out.
    Also adds `fps_ratio` (fps over the fewest classifiers' fps) to every row.
    """
    first, last = counts[0], counts[-1]
    by_kind: dict[str, dict[int, dict]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], {})[row["count"]] = row
    for kind_rows in by_kind.values():
        for row in kind_rows.values():
            row["fps_ratio"] = row["fps"] / kind_rows[first]["fps"]

    def rest(kind: str, count: int) -> float:
        row = by_kind[kind][count]
        return row["ms_per_frame"] - row["base_ms"]

    def marginal(kind: str) -> float:
        return (rest(kind, last) - rest(kind, first)) / (last - first)

    discrete_marginal = marginal(DISCRETE.name)
    summary: dict[str, dict] = {DISCRETE.name: {"marginal_ms": discrete_marginal}}
    for kind in [*(k.name for k in MC_KINDS), MIXED]:
        base_ms = statistics.median(row["base_ms"] for row in by_kind[kind].values())
        mc_marginal = marginal(kind)
        summary[kind] = {
            "base_ms": base_ms,
            "marginal_ms": mc_marginal,
            "marginal_pct_of_base": 100 * mc_marginal / base_ms,
            "fps_ratio_measured": by_kind[kind][last]["fps_ratio"],
            "fps_ratio": (base_ms + rest(kind, first)) / (base_ms + rest(kind, last)),
            # None when noise made the MC side shrink: the ratio is then meaningless, not infinite.
            "marginal_ratio": discrete_marginal / mc_marginal if mc_marginal > 0 else None,
            "break_even": break_even(base_ms, mc_marginal, discrete_marginal),
        }
    return summary


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    return "ok" if (value >= target if higher_is_better else value <= target) else "MISS"


def print_report(rows: list[dict], summary: dict, settings: Settings, decode_ms: float) -> None:
    first, last = settings.counts[0], settings.counts[-1]
    width, height = settings.input_size
    print(
        f"\nMC scaling on {settings.video.name} at {width}x{height}, {settings.frames} frames x {settings.repeats}"
        f" repeats (per-frame median), turns of {settings.block} frames, ONNX Runtime {ort.__version__},"
        f" {os.cpu_count()} CPUs"
    )
    print(f"decode (once, not in the rows): {decode_ms:.2f} ms/frame\n")
    print(
        f"{'kind':<11}{'N':>4}{'fps':>8}{'ms/frame':>10}{'base ms':>9}{'MC ms':>8}{'other ms':>10}"
        f"{'matched':>9}{'sends':>7}{f'fps/fps({first})':>13}"
    )
    for row in rows:
        print(
            f"{row['kind']:<11}{row['count']:>4}{row['fps']:>8.2f}{row['ms_per_frame']:>10.2f}{row['base_ms']:>9.2f}"
            f"{row['mc_ms']:>8.2f}{row['other_ms']:>10.2f}{row['matched_fraction']:>9.0%}"
            f"{row['sends_per_frame']:>7.2f}{row['fps_ratio']:>13.3f}"
        )
    print(
        "other ms = resize + smoothing + JPEG of matched frames + sink; matched = distinct frames sent; "
        "sends = frame messages per frame; discrete rows run no base DNN"
    )
    discrete = summary[DISCRETE.name]["marginal_ms"]
    print(f"\nmarginal cost of one more discrete classifier: {discrete:.3f} ms/frame")
    ratio = f"fps({last})/fps({first})"
    print(
        f"{'kind':<11}{'MC marginal ms':>15}{'% of base':>11}{ratio + ' measured':>24}{'base-pooled':>13}"
        f"{'discrete/MC':>15}{'break-even N':>14}"
    )
    for kind in [*(k.name for k in MC_KINDS), MIXED]:
        s = summary[kind]
        even = "never" if s["break_even"] is None else str(s["break_even"])
        fps_ok = verdict(s["fps_ratio"], TARGETS["fps_ratio"])
        marginal_ratio = "n/a" if s["marginal_ratio"] is None else f"{s['marginal_ratio']:.1f}x"
        ratio_ok = verdict(s["marginal_ratio"], TARGETS["marginal_ratio"])
        even_ok = "MISS" if s["break_even"] is None else verdict(s["break_even"], TARGETS["break_even"], False)
        print(
            f"{kind:<11}{s['marginal_ms']:>15.3f}{s['marginal_pct_of_base']:>10.2f}%{s['fps_ratio_measured']:>24.3f}"
            f"{s['fps_ratio']:>8.3f} {fps_ok:<4}{marginal_ratio:>10} {ratio_ok:<4}{even:>9} {even_ok:<4}"
        )
    print(f"marginal = growth of (ms/frame - base ms) from {first} to {last} classifiers, per classifier")
    print_floor(summary["compute_floor"])
    print(
        f"targets: {ratio} >= {TARGETS['fps_ratio']} (paper 0.44), discrete/MC marginal >= "
        f"{TARGETS['marginal_ratio']:.0f}x (paper 11x), break-even <= {TARGETS['break_even']} (paper 4)"
    )


def print_floor(floor: dict[str, dict]) -> None:
    print(f"\ncompute floor (MACs, no timing): discrete classifier {floor[DISCRETE.name]['mmacs']:.1f} M")
    print(f"{'kind':<11}{'MC MMAC':>9}{'base MMAC':>11}{'% of base':>11}{'discrete/MC':>13}{'break-even N':>14}")
    for kind in [*(k.name for k in MC_KINDS), MIXED]:
        f = floor[kind]
        even = "never" if f["break_even"] is None else str(f["break_even"])
        print(
            f"{kind:<11}{f['mmacs']:>9.2f}{f['base_mmacs']:>11.0f}{f['pct_of_base']:>10.2f}%"
            f"{f['discrete_ratio']:>12.1f}x{even:>14}"
        )


def write_json(path: Path, rows: list[dict], summary: dict, settings: Settings, decode_ms: float) -> None:
    meta = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()}
    meta.update(
        onnxruntime=ort.__version__, cpus=os.cpu_count(), machine=platform.machine(), python=platform.python_version()
    )
    document = {"settings": meta, "decode_ms": decode_ms, "targets": TARGETS, "rows": rows, "summary": summary}
    path.write_text(json.dumps(document, indent=2) + "\n")


def plot(path: Path, rows: list[dict], settings: Settings) -> None:
    """fps, and fps relative to the fewest classifiers, against the number of classifiers; one line per kind."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (absolute, relative) = plt.subplots(1, 2, figsize=(11, 4.5))
    for kind in [*(k.name for k in MC_KINDS), MIXED, DISCRETE.name]:
        points = sorted((row["count"], row["fps"], row["fps_ratio"]) for row in rows if row["kind"] == kind)
        counts, fps, ratios = zip(*points, strict=True)
        style = {"marker": "o", "linestyle": "--" if kind == DISCRETE.name else "-", "label": kind}
        absolute.plot(counts, fps, **style)
        relative.plot(counts, ratios, **style)
    relative.axhline(TARGETS["fps_ratio"], color="grey", linewidth=1, linestyle=":", label="target")
    absolute.set_ylabel("frames/s (full pipeline)")
    relative.set_ylabel(f"fps / fps({settings.counts[0]})")
    for axes in (absolute, relative):
        axes.set_xscale("log")
        axes.set_xticks(settings.counts, [str(c) for c in settings.counts])
        axes.set_xlabel("classifiers per frame")
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
    relative.legend()
    width, height = settings.input_size
    figure.suptitle(f"MC scaling, {settings.video.name} at {width}x{height}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------------------
# Command line


def default_video() -> Path:
    env = os.environ.get("FILTERFORWARD_DATA")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root / CLIP


def parse_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"input size must look like 768x448, got {text!r}") from None
    try:
        return check_input_size((width, height))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if len(counts) < 2 or counts[0] < 1 or list(counts) != sorted(set(counts)):
        raise argparse.ArgumentTypeError(f"counts must be increasing positive integers like 1,10,50, got {text!r}")
    return counts


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--video", type=Path, default=None, help="clip to replay (default: intel-car-detection)")
    parser.add_argument("--input-size", type=parse_size, default=None, help="base-DNN input WxH (default 768x448)")
    parser.add_argument("--frames", type=positive, default=None, help="frames replayed per repeat (default 30)")
    parser.add_argument("--counts", type=parse_counts, default=None, help="classifiers per row (default 1,10,50)")
    parser.add_argument("--repeats", type=positive, default=None, help="timed blocks per configuration (default 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed frames per configuration first (default 3)")
    parser.add_argument("--block", type=positive, default=10, help="consecutive frames per configuration (default 10)")
    parser.add_argument("--threads", type=positive, default=None, help="base-DNN threads (default: ONNX Runtime's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random MC weights")
    parser.add_argument("--base-model", type=Path, help="ONNX base model, e.g. an int8 or bf16 export (default fp32)")
    parser.add_argument(
        "--mc-weights", choices=get_args(MCWeights), default="fp32", help="the MC bank's FC weights (default fp32)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for results.json and the plot")
    parser.add_argument("--quick", action="store_true", help="smoke run: few frames, small input, counts 1,3")
    args = parser.parse_args(argv)
    quick = args.quick
    return Settings(
        video=args.video or default_video(),
        input_size=args.input_size or ((256, 160) if quick else (768, 448)),
        frames=args.frames or (4 if quick else 30),
        counts=args.counts or ((1, 3) if quick else (1, 10, 50)),
        repeats=args.repeats or (1 if quick else 3),
        warmup=args.warmup if args.warmup is not None else (1 if quick else 3),
        block=args.block,
        threads=args.threads,
        seed=args.seed,
        out=args.out,
        base_model=args.base_model,
        mc_weights=args.mc_weights,
    )


def run(settings: Settings) -> tuple[list[dict], dict, float]:
    """The whole benchmark: rows, summary and decode ms/frame; writes results.json and mc_scaling.png."""
    if not settings.video.is_file():
        raise FilterForwardError(f"video {settings.video} does not exist: pass --video or set FILTERFORWARD_DATA")
    try:
        import matplotlib  # noqa: F401  # fail before minutes of timing, not after
    except ImportError:
        raise FilterForwardError("matplotlib is missing: pip install -e '.[dev]' to draw the plot") from None
    settings.out.mkdir(parents=True, exist_ok=True)
    frames, decode_ms, fps = decode_frames(settings.video, settings.frames)
    base = BaseDNN(settings.input_size, settings.base_model, settings.threads)
    configs = build_configs(settings, base, frames, fps)
    run_all(configs, frames, fps, settings)
    rows = [row_of(config) for config in configs]
    summary = summarise(rows, settings.counts)
    summary["compute_floor"] = compute_floor(base)
    write_json(settings.out / "results.json", rows, summary, settings, decode_ms)
    plot(settings.out / "mc_scaling.png", rows, settings)
    return rows, summary, decode_ms


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # our progress, without a line per loaded filter
    settings = parse_args(argv)
    try:
        rows, summary, decode_ms = run(settings)
    except FilterForwardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(rows, summary, settings, decode_ms)
    print(f"\nwrote {settings.out / 'results.json'} and {settings.out / 'mc_scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
