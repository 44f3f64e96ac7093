"""Benchmark: the reduced-precision base DNNs against fp32 — speed, tap fidelity and what it does to a filter.

Exports int8 (calibrated on --calibration frames, default 64 spread over the car clip) and bf16, then at 768x448
with 2 threads:

- ms/frame of every (precision, runtime) pair for the three taps (`mid only`: for `mid` alone, the graph pruned
  to it, as the edge runs it when every filter reads `mid`): each round runs every pair on every frame back to
  back, in rotating order, so load from elsewhere on a shared machine lands on all alike; a row is the median;
- tap cosine vs fp32 on held-out frames (car-clip frames between the calibration ones, and another camera):
  per tap the mean over frames, the smallest of those (`min tap cos`, the issue's measure) and the worst
  single frame (`worst frame`); and how often the ImageNet top-1 class agrees with fp32;
- event F1 of a full_frame MC for red_vehicle_present trained on each precision's own features (frames
  0:212) and replayed through the edge pipeline on that precision (frames 212:377), per seed.

    python bench/base_precision.py                       # everything (about 10 minutes on 2 cores)
    python bench/base_precision.py --no-f1 --rounds 3    # speed and fidelity only
    python bench/base_precision.py --json bench/out/base_precision.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edge.replay import replay
from models.base_export import ensure_base_model
from models.base_precision import DEFAULT_CALIBRATION_FRAMES, export_precision
from models.base_runtime import openvino_capabilities
from models.basednn import BaseDNN, resize
from models.datasets import LabelledDataset, open_dataset
from models.errors import FilterForwardError
from models.evaluation import BOUNDARY_TOLERANCE, event_f1

log = logging.getLogger("bench.base_precision")

REPO = Path(__file__).resolve().parents[1]
SIZE = (768, 448)
THREADS = 2
TAPS = ("early", "mid", "late")
MID = ("mid",)  # what filters that all read `mid` (the default filter's usual tap) need
CAR = "intel-car-detection"
OTHER_CAMERA = "tud-campus"
EVENT = "red_vehicle_present"
TRAIN, TEST = (0, 212), (212, 377)
# (label, precision, runtime); OpenVINO rows are left out where it is not installed.
PAIRS = (
    ("fp32 onnxruntime", "fp32", "onnxruntime"),
    ("int8 onnxruntime", "int8", "onnxruntime"),
    ("int8 openvino", "int8", "openvino"),
    ("bf16 openvino", "bf16", "openvino"),
)


@dataclass
class Row:
    label: str
    precision: str
    runtime: str
    ms: list[float] = field(default_factory=list)
    mid_ms: list[float] = field(default_factory=list)  # `mid` alone: the graph pruned to it (models/base_runtime.py)
    mean_cos: dict[str, float] = field(default_factory=dict)
    worst_cos: float = 1.0
    top1_agreement: float = 1.0

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms)

    @property
    def min_tap_cos(self) -> float:
        return min(self.mean_cos.values())


@dataclass
class F1Row:
    precision: str
    f1: list[float] = field(default_factory=list)


def held_out_frames(data: Path, calibration_count: int, per_camera: int) -> np.ndarray:
    """Car-clip frames halfway between calibration frames, and frames of another camera, at SIZE."""
    car = open_dataset(data / CAR)
    calibration = np.linspace(0, car.n_frames - 1, calibration_count)  # as models/base_precision.py picks them
    between = ((calibration[:-1] + calibration[1:]) / 2).astype(int)
    wanted = set(between[np.linspace(0, len(between) - 1, per_camera).round().astype(int)].tolist())
    images = [image for index, image in car.frames(0, max(wanted) + 1) if index in wanted]
    images += [image for _, image in open_dataset(data / OTHER_CAMERA).frames(0, per_camera * 5)][::5]
    return np.stack([resize(image, SIZE) for image in images])


def open_bases(models: dict[str, Path]) -> dict[str, tuple[Row, BaseDNN]]:
    has_openvino = openvino_capabilities() is not None
    return {
        label: (Row(label, precision, runtime), BaseDNN(SIZE, models[precision], THREADS, runtime))
        for label, precision, runtime in PAIRS
        if has_openvino or runtime != "openvino"
    }


def time_bases(bases: dict[str, tuple[Row, BaseDNN]], frames: np.ndarray, rounds: int) -> None:
    """Interleaved: every round runs every base on every frame, the order rotating from round to round."""
    order = list(bases.values())
    for _, base in order:
        base.run(frames[0], TAPS)  # warm-up: first-run allocations are not the steady state
        base.run(frames[0], MID)
    for index in range(rounds):
        for row, base in order[index % len(order) :] + order[: index % len(order)]:
            for frame in frames:
                for taps, times in ((TAPS, row.ms), (MID, row.mid_ms)):
                    started = time.perf_counter()
                    base.run(frame, taps)
                    times.append(1000 * (time.perf_counter() - started))


def fidelity(bases: dict[str, tuple[Row, BaseDNN]], frames: np.ndarray) -> None:
    """Tap cosines and top-1 agreement of every base against the first (fp32)."""
    rows = list(bases.values())
    _, reference = rows[0]
    wanted = [*TAPS, "logits"]
    truth = [reference.run(frame, wanted) for frame in frames]
    for row, base in rows:
        outputs = [base.run(frame, wanted) for frame in frames]
        cosines = np.array([[cosine(t[tap], o[tap]) for tap in TAPS] for t, o in zip(truth, outputs, strict=True)])
        row.mean_cos = dict(zip(TAPS, cosines.mean(axis=0).round(4).tolist(), strict=True))
        row.worst_cos = round(float(cosines.min()), 4)
        agree = [t["logits"].argmax() == o["logits"].argmax() for t, o in zip(truth, outputs, strict=True)]
        row.top1_agreement = float(np.mean(agree))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def f1_rows(car: LabelledDataset, models: dict[str, Path], seeds: Sequence[int]) -> list[F1Row]:
    """Per precision: a full_frame MC trained on its features, replayed on it, scored on the test frames."""
    from models.training import TrainConfig, train_mc

    rows = []
    for precision, path in models.items():
        row = F1Row(precision)
        for seed in seeds:
            config = TrainConfig(
                event=EVENT, architecture="full_frame", input_size=SIZE, frames=TRAIN, seed=seed, name=f"red-{seed}"
            )
            with tempfile.TemporaryDirectory(prefix="ff-precision-") as folder:
                train_mc(car, config, Path(folder), path, progress=False)
                sink = replay(car, [Path(folder)], TEST, path, progress=False, gate=None)
            predicted = np.zeros(TEST[1] - TEST[0], bool)
            predicted[np.asarray(sorted(sink.frames.get(config.name, ())), int) - TEST[0]] = True
            row.f1.append(event_f1(car.labels[EVENT][TEST[0] : TEST[1]], predicted, BOUNDARY_TOLERANCE).f1)
            log.info("%s seed %d: event F1 %.3f", precision, seed, row.f1[-1])
        rows.append(row)
    return rows


def print_tables(rows: list[Row], f1: list[F1Row]) -> None:
    base_ms = rows[0].median_ms
    print(f"\nbase DNN at {SIZE[0]}x{SIZE[1]}, {THREADS} threads; cosine and top-1 vs fp32 on held-out frames")
    print(f"{'precision runtime':<18} {'ms/frame':>8} {'speed-up':>8} {'mid only':>8} {'min tap cos':>11} "
          f"{'worst frame':>11} {'early':>6} {'mid':>6} {'late':>6} {'top-1':>6}")  # fmt: skip
    for row in rows:
        cos = row.mean_cos
        print(
            f"{row.label:<18} {row.median_ms:>8.1f} {base_ms / row.median_ms:>7.2f}x "
            f"{statistics.median(row.mid_ms):>8.1f} {row.min_tap_cos:>11.4f} "
            f"{row.worst_cos:>11.4f} {cos['early']:>6.4f} {cos['mid']:>6.4f} {cos['late']:>6.4f} "
            f"{row.top1_agreement:>6.2f}"
        )
    if not f1:
        return
    reference = statistics.mean(f1[0].f1)
    print(
        f"\nevent F1, full_frame MC for {EVENT}, trained on frames {TRAIN[0]}:{TRAIN[1]} of each precision's features"
    )
    print(f"{'precision':<10} {'F1 per seed':<28} {'mean':>6} {'change':>7}")
    for row in f1:
        mean = statistics.mean(row.f1)
        print(f"{row.precision:<10} {' '.join(f'{v:.3f}' for v in row.f1):<28} {mean:>6.3f} {mean - reference:>+7.3f}")


def write_json(path: Path, rows: list[Row], f1: list[F1Row], settings: argparse.Namespace) -> None:
    import onnxruntime

    payload = {
        "input_size": SIZE,
        "threads": THREADS,
        "cpu_capabilities": sorted(openvino_capabilities() or ()),
        "onnxruntime": onnxruntime.__version__,
        "calibration": [str(p) for p in settings.calibration],
        "calibration_frames": settings.calibration_frames,
        "rounds": settings.rounds,
        "rows": [asdict(r) | {"median_ms": r.median_ms, "min_tap_cos": r.min_tap_cos} for r in rows],
        "f1": [asdict(r) for r in f1],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = Path(os.environ.get("FILTERFORWARD_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=default_data, help="folder with the real clips")
    parser.add_argument("--calibration", type=Path, nargs="+", help="int8 calibration sources (default: the car clip)")
    parser.add_argument("--calibration-frames", type=int, default=DEFAULT_CALIBRATION_FRAMES)
    parser.add_argument("--frames", type=int, default=8, help="held-out frames per camera (timing uses the car's)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="F1 training seeds")
    parser.add_argument("--no-f1", dest="f1", action="store_false", help="skip the event F1 part (minutes)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    args.calibration = args.calibration or [args.data / CAR]
    return args


def run(settings: argparse.Namespace) -> tuple[list[Row], list[F1Row]]:
    models = {
        "fp32": ensure_base_model(),
        "int8": export_precision("int8", None, settings.calibration, settings.calibration_frames, SIZE),
        "bf16": export_precision("bf16"),
    }
    frames = held_out_frames(settings.data, settings.calibration_frames, settings.frames)
    bases = open_bases(models)
    fidelity(bases, frames)
    time_bases(bases, frames[: settings.frames], settings.rounds)
    rows = [row for row, _ in bases.values()]
    f1 = f1_rows(open_dataset(settings.data / CAR), models, settings.seeds) if settings.f1 else []
    return rows, f1


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    settings = parse_args(argv)
    try:
        rows, f1 = run(settings)
    except FilterForwardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_tables(rows, f1)
    if settings.json:
        write_json(settings.json, rows, f1, settings)
        print(f"\nwrote {settings.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
