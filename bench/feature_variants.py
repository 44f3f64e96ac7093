"""Development check of transforms of the tap before the default filter's MCs read it, on bench/tap_rule.py's cases
(inside the benchmark's training prefixes, or clips it does not use: no benchmark test frame is read).

For each case, size and seed, both candidates of the default filter (full_frame ensembles on `mid` and `late`, its
context cells) are cross-validated and trained on the training frames of each variant of the tap, and scored in
torch on the test frames at the operating point the default filter would ship (the held-out k-of-n at the final
model's own threshold). Variants:

* `as is`: the tap as the edge computes it today;
* `background`: the tap and the tap minus its causal running average (time constant BACKGROUND_SECONDS) as extra
  channels, a feature-space background model: a person who stands still fades from the second half;
* `difference`: that difference alone;
* `standardised`: every channel shifted and scaled by its mean and deviation over the training frames' region.

Each variant gets tap_rule.py's report (the two draws from consecutive seeds, the tap rule).

    cd bench && ../.venv/bin/python feature_variants.py --seeds 0-3 --sizes half,default
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from generalization import open_clip
from tap_alternatives import region_data
from tap_rule import (
    CASES,
    Case,
    Outcome,
    add_case_arguments,
    candidate_config,
    candidate_name,
    case_clip,
    chosen_cases,
    print_report,
)

from models.crossval import FINAL_THRESHOLD, CrossValidation, OperatingPoint, choose_operating_point
from models.datasets import LabelledDataset
from models.evaluation import BOUNDARY_TOLERANCE, event_f1
from models.features import FeatureRequest, cached_features
from models.model_selection import CANDIDATES
from models.roi import FULL_FRAME
from models.training import TrainConfig, cross_validate, fit_mc, predict

BACKGROUND_SECONDS = 5.0
# A variant: the whole tap of frames 0..n-1 [n, C, H, W] (float32), the clip's fps and the training frames' region
# cells (to take statistics from) -> the features the MC reads.
Transform = Callable[[np.ndarray, float, np.ndarray], np.ndarray]


def difference(tap: np.ndarray, fps: float) -> np.ndarray:
    """Each frame's tap minus the running average of the frames up to it (causal: what an edge could keep)."""
    rate = 1.0 / (BACKGROUND_SECONDS * fps)
    out, average = np.empty_like(tap), tap[0].copy()
    for index, frame in enumerate(tap):
        average += rate * (frame - average)
        out[index] = frame - average
    return out


def standardised(tap: np.ndarray, training_cells: np.ndarray) -> np.ndarray:
    mean = training_cells.mean(axis=(0, 2, 3), keepdims=True)
    return (tap - mean) / (training_cells.std(axis=(0, 2, 3), keepdims=True) + 1e-3)


VARIANTS: dict[str, Transform] = {
    "as is": lambda tap, fps, cells: tap,
    "background": lambda tap, fps, cells: np.concatenate([tap, difference(tap, fps)], axis=1),
    "difference": lambda tap, fps, cells: difference(tap, fps),
    "standardised": lambda tap, fps, cells: standardised(tap, cells),
}


def variant_features(dataset: LabelledDataset, case: Case, config: TrainConfig, transform: Transform) -> np.ndarray:
    """The whole tap of the case's frames 0..test_stop-1 through the variant (statistics from the training part)."""
    request = FeatureRequest(config.tap_name, FULL_FRAME)
    cached = cached_features(dataset, [request], config.input_size, (0, case.test_stop), progress=False)
    tap = cached[request].astype(np.float32)
    rows, cols = config.roi.cells(tap.shape[2], tap.shape[3])
    return transform(tap, dataset.fps, tap[: case.train_stop, :, rows, cols]).astype(np.float16)


@dataclass(frozen=True)
class Draw:
    """One candidate trained from one seed as the default filter trains it, and its scores of the test frames."""

    validation: CrossValidation | None  # estimate at the shipped operating point; None: not measurable
    point: OperatingPoint  # what it ships with
    labels: np.ndarray  # the training frames' labels, by frame (TrainingData.frame_labels)
    test_scores: np.ndarray  # the final model's scores of frames train_stop..test_stop-1


def train_draw(case: Case, dataset: LabelledDataset, config: TrainConfig, transform: Transform) -> Draw:
    """Cross-validate and train the candidate on the case's training frames (without a cross-validation: the
    operating point best on the training frames, as training does) and score the test frames."""
    features = variant_features(dataset, case, config, transform)
    train = region_data(dataset, case.event, features[: case.train_stop], config.roi)
    every = region_data(dataset, case.event, features, config.roi)
    validation = cross_validate(train, config, partial(fit_mc, config, progress=False), threshold=FINAL_THRESHOLD)
    model, _ = fit_mc(config, train, progress=False)
    if validation is None:
        point, _ = choose_operating_point(predict(model, train, np.arange(case.train_stop)), train.frame_labels())
    else:
        point = validation.point
    scores = predict(model, every, np.arange(case.train_stop, case.test_stop))
    return Draw(validation, point, train.frame_labels(), scores)


def candidate_outcome(
    case: Case, dataset: LabelledDataset, config: TrainConfig, transform: Transform
) -> tuple[float, float]:
    """The candidate's cross-validated estimate (-1: not measurable) and its test event F1 as the default filter
    would ship it."""
    draw = train_draw(case, dataset, config, transform)
    truth = dataset.labels[case.event][case.train_stop : case.test_stop]
    f1 = event_f1(truth, draw.point.apply(draw.test_scores), BOUNDARY_TOLERANCE).f1
    return (draw.validation.validation.event_f1 if draw.validation else -1.0), f1


def run_case(
    case: Case, data: Path, size: str, seeds: Sequence[int], variants: dict[str, Transform]
) -> dict[str, list[Outcome]]:
    dataset = open_clip(case_clip(case), data)
    outcomes: dict[str, list[Outcome]] = {name: [] for name in variants}
    for name, transform in variants.items():
        for seed in seeds:
            outcome = Outcome(f"{case.clip} {case.event}", size, seed, {}, {})
            for candidate in CANDIDATES:
                config = candidate_config(case, dataset, size, candidate, seed, None)
                label = candidate_name(*candidate)
                outcome.estimates[label], outcome.test_f1[label] = candidate_outcome(case, dataset, config, transform)
            outcomes[name].append(outcome)
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_arguments(parser, (0, 1, 2, 3))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    if unknown := set(names) - set(VARIANTS):
        parser.error(f"unknown variants {sorted(unknown)}: choose from {', '.join(VARIANTS)}")
    chosen = {name: VARIANTS[name] for name in names}
    outcomes: dict[str, list[Outcome]] = {name: [] for name in chosen}
    for case in chosen_cases(CASES, args.cases):
        for size in args.sizes.split(","):
            for name, found in run_case(case, args.data, size, args.seeds, chosen).items():
                outcomes[name] += found
    for name, found in outcomes.items():
        print(f"\n=== {name}")
        print_report(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
