"""Development check of two ways to use both taps at once, on bench/tap_rule.py's cases (inside the benchmark's
training prefixes: no benchmark test frame is read).

For each case and seed, next to the default filter's two candidates (full_frame on `mid`, on `late`):

* `averaged`: both candidates' logits averaged per frame, its operating point chosen on the averaged
  out-of-fold scores of cross-validation (as the default filter chooses its own);
* `stacked`: one full_frame MC on `mid` cells with the `late` cell above each (upsampled 2x) concatenated,
  432 channels.

Every model is an ENSEMBLE-seed ensemble trained on the case's training frames and scored (torch, as the edge
would) on its test frames. The tap rule's pick is printed alongside.

    python bench/tap_alternatives.py --seeds 0-2 --size half
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import numpy as np
from generalization import REPO, input_size, open_clip, seed_range
from tap_rule import CASES, Case, case_clip

from models.crossval import CrossValidation, choose_operating_point
from models.datasets import LabelledDataset
from models.datasets.labelled import UNCERTAIN
from models.evaluation import BOUNDARY_TOLERANCE, event_f1
from models.features import FeatureRequest, cached_features
from models.model_selection import ENSEMBLE, TIE
from models.roi import FULL_FRAME, ROI
from models.training import (
    TrainConfig,
    TrainingData,
    channels_last,
    cross_validate,
    fit_mc,
    load_training_data,
    predict,
)

COLUMNS = ("mid", "late", "rule", "averaged", "stacked")
Outcome = Callable[[Case], Iterator[tuple[int, dict[str, float]]]]  # a case -> (seed, test F1 per column) ...


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return np.log(p / (1 - p))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def fit_and_score(config: TrainConfig, train: TrainingData, every: TrainingData, test: np.ndarray):
    """Cross-validation on the training frames, the model on all of them, and its scores on the test frames."""
    validation = cross_validate(train, config, partial(fit_mc, config, progress=False))
    model, _ = fit_mc(config, train, progress=False)
    return validation, predict(model, every, test)


def stacked_data(dataset: LabelledDataset, case: Case, size: tuple[int, int], stop: int) -> TrainingData:
    """Frames 0..stop-1 as `mid` cells with the `late` cell above each concatenated, cut to the event's region."""
    requests = [FeatureRequest("mid", FULL_FRAME), FeatureRequest("late", FULL_FRAME)]
    cached = cached_features(dataset, requests, size, (0, case.test_stop), progress=False)
    mid, late = cached[requests[0]][:stop], cached[requests[1]][:stop]
    late = late.repeat(2, axis=2).repeat(2, axis=3)[:, :, : mid.shape[2], : mid.shape[3]]
    return region_data(dataset, case.event, np.concatenate([mid, late], axis=1), dataset.roi(case.event))


def region_data(dataset: LabelledDataset, event: str, features: np.ndarray, roi: ROI) -> TrainingData:
    """Whole-tap features of frames 0..n-1 [n, C, H, W], cut to the region's crop, with the event's labels."""
    rows, cols = roi.cells(features.shape[2], features.shape[3])
    crops = np.ascontiguousarray(features[:, :, rows, cols])
    labels = dataset.labels[event][: len(features)]
    certain = np.flatnonzero(labels != UNCERTAIN)
    targets = (labels[certain] == 1).astype(np.float32)
    mask = roi.cell_mask(features.shape[2], features.shape[3])
    return TrainingData(crops, 0, (0, len(crops)), labels, certain, targets, 1, dataset.fps, mask, channels_last(crops))


def run_case(case: Case, dataset: LabelledDataset, size: tuple[int, int], seed: int) -> dict[str, float]:
    truth = dataset.labels[case.event][case.train_stop : case.test_stop]
    test = np.arange(case.train_stop, case.test_stop)

    def scored(validation: CrossValidation, scores: np.ndarray) -> float:
        return event_f1(truth, validation.point.apply(scores), BOUNDARY_TOLERANCE).f1

    config = TrainConfig(
        event=case.event,
        architecture="full_frame",
        input_size=size,
        roi=dataset.roi(case.event),
        frames=(0, case.train_stop),
        seed=seed,
        ensemble=ENSEMBLE,
    )
    results, out = {}, {}
    for tap in ("mid", "late"):
        tapped = dataclasses.replace(config, tap=tap)
        train = load_training_data(dataset, tapped, progress=False)
        every = load_training_data(dataset, dataclasses.replace(tapped, frames=(0, case.test_stop)), progress=False)
        results[tap] = fit_and_score(tapped, train, every, test)
        out[tap] = scored(*results[tap])
    estimates = {tap: v.validation.event_f1 for tap, (v, _) in results.items()}
    out["rule"] = out["late" if estimates["late"] > estimates["mid"] + TIE else "mid"]
    averaged_oof = sigmoid((logit(results["mid"][0].scores) + logit(results["late"][0].scores)) / 2)
    point, _ = choose_operating_point(averaged_oof, _labels(dataset, case))
    averaged_test = sigmoid((logit(results["mid"][1]) + logit(results["late"][1])) / 2)
    out["averaged"] = event_f1(truth, point.apply(averaged_test), BOUNDARY_TOLERANCE).f1
    stacked = dataclasses.replace(config, tap="mid")
    train, every = (stacked_data(dataset, case, size, stop) for stop in (case.train_stop, case.test_stop))
    out["stacked"] = scored(*fit_and_score(stacked, train, every, test))
    return out


def _labels(dataset: LabelledDataset, case: Case) -> np.ndarray:
    return np.asarray(dataset.labels[case.event][: case.train_stop])


def dev_arguments(description: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """The options of the development checks on tap_rule.py's cases."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="folder with the clips")
    parser.add_argument("--seeds", type=seed_range, default=(0, 1, 2), help="seeds, e.g. 0-2 (default)")
    parser.add_argument("--size", choices=("default", "half"), default="half")
    return parser.parse_args(argv)


def print_line(label: str, values: Sequence[str], width: int) -> None:
    print(f"{label:<44} " + "  ".join(f"{v:>{width}}" for v in values), flush=True)


def print_summary(taken: dict[str, list[float]], width: int) -> None:
    """Mean and worst test event F1 of each column."""
    print()
    print_line("test event F1: mean", [f"{statistics.fmean(v):.3f}" for v in taken.values()], width)
    print_line("worst", [f"{min(v):.3f}" for v in taken.values()], width)


def run_checks(cases: Sequence[Case], columns: Sequence[str], width: int, outcome: Outcome) -> None:
    """Print each case's and seed's test event F1 per column, then each column's mean and worst."""
    taken: dict[str, list[float]] = {column: [] for column in columns}
    print_line("case, seed", columns, width)
    for case in cases:
        for seed, out in outcome(case):
            print_line(f"{case.clip} {case.event} {seed}", [f"{out[c]:.3f}" for c in columns], width)
            for column in columns:
                taken[column].append(out[column])
    print_summary(taken, width)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = dev_arguments(__doc__, argv)

    def outcome(case: Case) -> Iterator[tuple[int, dict[str, float]]]:
        dataset = open_clip(case_clip(case), args.data)
        for seed in args.seeds:
            yield seed, run_case(case, dataset, input_size(dataset, args.size), seed)

    run_checks(CASES, COLUMNS, 8, outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
