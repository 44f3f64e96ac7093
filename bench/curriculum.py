"""Benchmark: do the curriculum schedules (window, resolution) make MC training faster or steadier?

On the clips, events and splits of bench/generalization.py, at half the default input size, each MC kind
is trained with and without its curriculum, seeds 0-2, 300 steps. Inside the training prefix the last
block of the cross-validation plan (the latest occurrences, with a guard band) is a validation block the
MC never trains on; every 25 steps the MC scores it, and its event F1 at the operating point chosen there
gives the learning curve. Reported: steps to the best validation F1 (the first checkpoint within 0.01 of
the curve's best), the best and the final validation F1, and the test F1 of the final MC at the operating
point chosen on the validation block (test frames as in generalization.py, never used for any choice).

    python bench/curriculum.py                          # full_frame and windowed, seeds 0-2
    python bench/curriculum.py --kinds full_frame --seeds 0 --clips tud-stadtmitte   # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from generalization import CLIPS, REPO, Clip, choices, input_size, open_clip, seed_range

from models.crossval import choose_operating_point, plan_folds
from models.datasets import LabelledDataset
from models.evaluation import BOUNDARY_TOLERANCE, event_f1
from models.microclassifiers import MicroClassifier
from models.training import TrainConfig, TrainingData, fit_mc, load_training_data, parse_curriculum, predict

log = logging.getLogger("bench.curriculum")

STEPS, EVERY, NEAR_BEST = 300, 25, 0.01
# Each kind's curriculum, reaching full difficulty at half the steps (the seed paper's schedules ramp linearly).
CURRICULA = {
    "full_frame": "resolution:fixed_linear:25:100:150",
    "windowed": "window:fixed_linear:1:5:150",
}


@dataclass
class Row:
    clip: str
    event: str
    kind: str
    curriculum: str  # "-" without
    steps_to_best: list[int] = field(default_factory=list)
    best_val: list[float] = field(default_factory=list)
    final_val: list[float] = field(default_factory=list)
    test: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    curves: list[list[float]] = field(default_factory=list)  # validation F1 every EVERY steps, per seed


def validation_split(data: TrainingData, fps: float, context: int) -> tuple[np.ndarray, np.ndarray]:
    """(frames to train on, validation frames): the last block of the training code's own fold plan."""
    merge_gap, guard = max(2, round(fps)), max(2, round(fps / 5), context)
    plan = plan_folds(data.frame_labels(), data.span, merge_gap=merge_gap, guard=guard)
    if not plan.folds:
        raise SystemExit("error: a training prefix too thin for a validation block; check the split")
    last = plan.folds[-1]
    return last.train, last.held_out


def val_f1(model: MicroClassifier, data: TrainingData, frames: np.ndarray, labels: np.ndarray) -> float:
    scores = np.full(labels.size, np.nan)
    scores[frames] = predict(model, data, frames)
    return choose_operating_point(scores, labels)[1]


def train_variant(
    dataset: LabelledDataset, clip: Clip, event: str, kind: str, curriculum: str | None, seed: int, size
) -> tuple[list[float], float, float]:
    """(validation curve, test F1, seconds) of one training run."""
    config = TrainConfig(
        event=event,
        architecture=kind,
        input_size=size,
        roi=dataset.roi(event),
        frames=(0, dataset.n_frames),  # features of every frame; the MC trains on the prefix's train part only
        seed=seed,
        steps=STEPS,
        curricula=(parse_curriculum(curriculum),) if curriculum else (),
    )
    everything = load_training_data(dataset, config, progress=False)
    prefix = dataclasses.replace(everything, span=(0, clip.train_stop), labels=everything.labels[: clip.train_stop])
    train, validation = validation_split(prefix, dataset.fps, config.context)
    labels = prefix.frame_labels()
    curve: list[float] = []

    def checkpoint(step: int, model: MicroClassifier) -> None:
        if step % EVERY == 0:
            curve.append(val_f1(model, everything, validation, labels))

    started = time.perf_counter()
    model, _ = fit_mc(config, everything.only(train), progress=False, on_step=checkpoint)
    seconds = time.perf_counter() - started
    val_scores = np.full(labels.size, np.nan)
    val_scores[validation] = predict(model, everything, validation)
    point, _ = choose_operating_point(val_scores, labels)
    test = np.arange(clip.train_stop, dataset.n_frames)
    decisions = point.apply(predict(model, everything, test))
    return curve, event_f1(dataset.labels[event][test], decisions, BOUNDARY_TOLERANCE).f1, seconds


def run(settings: argparse.Namespace) -> list[Row]:
    rows = []
    for clip in CLIPS:
        if clip.folder not in settings.clips:
            continue
        dataset = open_clip(clip, settings.data)
        size = input_size(dataset, "half")
        for event in clip.events:
            for kind in settings.kinds:
                for curriculum in (None, CURRICULA[kind]):
                    row = Row(clip.folder, event.name, kind, curriculum or "-")
                    for seed in settings.seeds:
                        curve, test, seconds = train_variant(dataset, clip, event.name, kind, curriculum, seed, size)
                        best = max(curve)
                        first = next(i for i, f in enumerate(curve) if f >= best - NEAR_BEST)
                        row.steps_to_best.append(EVERY * (first + 1))
                        row.best_val.append(best)
                        row.final_val.append(curve[-1])
                        row.test.append(test)
                        row.seconds.append(seconds)
                        row.curves.append(curve)
                        log.info("%s %s %s %s seed %d: test F1 %.3f, %.1f s", clip.folder, event.name, kind,
                                 row.curriculum, seed, test, seconds)  # fmt: skip
                    rows.append(row)
        print_table(rows)
    return rows


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'clip':<20} {'event':<20} {'kind':<11} {'curriculum':<36} {'steps to best':>13} {'best val':>8} "
        f"{'final val':>9} {'test F1':>7} {'min':>6} {'train s':>7}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        print(
            f"{r.clip:<20} {r.event:<20} {r.kind:<11} {r.curriculum:<36} {statistics.fmean(r.steps_to_best):13.0f} "
            f"{statistics.fmean(r.best_val):8.3f} {statistics.fmean(r.final_val):9.3f} "
            f"{statistics.fmean(r.test):7.3f} {min(r.test):6.3f} {statistics.fmean(r.seconds):7.1f}"
        )


def plot(path: Path, rows: list[Row]) -> None:
    """Mean validation F1 against steps, with and without the curriculum, one panel per clip/event/kind."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    panels = sorted({(r.clip, r.event, r.kind) for r in rows})
    figure, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), squeeze=False)
    for axis, panel in zip(axes[0], panels, strict=True):
        for row in (r for r in rows if (r.clip, r.event, r.kind) == panel):
            steps = EVERY * (1 + np.arange(len(row.curves[0])))
            axis.plot(steps, np.mean(row.curves, axis=0), label="with" if row.curriculum != "-" else "without")
        axis.set_title(f"{panel[0].split('-')[0]} {panel[1]}\n{panel[2]}", fontsize=8)
        axis.set_ylim(0, 1.05)
        axis.set_xlabel("step", fontsize=8)
        axis.legend(fontsize=7)
    axes[0][0].set_ylabel("validation event F1 (mean over seeds)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="folder with the clips")
    folders = tuple(c.folder for c in CLIPS)
    parser.add_argument("--clips", type=choices(folders), default=folders, help="comma-separated clip folders")
    parser.add_argument("--kinds", type=choices(tuple(CURRICULA)), default=tuple(CURRICULA), help="MC kinds")
    parser.add_argument("--seeds", type=seed_range, default=(0, 1, 2), help="seeds, e.g. 0-2 (default)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="folder for the plot and JSON")
    settings = parser.parse_args(argv)
    if not settings.data.is_dir():
        print(f"error: no clips at {settings.data}: give --data", file=sys.stderr)
        return 2
    rows = run(settings)
    plot(settings.out / "curriculum.png", rows)
    (settings.out / "curriculum.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    print(f"\nwrote {settings.out / 'curriculum.png'} and {settings.out / 'curriculum.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
