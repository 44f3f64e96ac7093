"""Development check: the default filter trained on too few frames to cross-validate, by the threshold it ships.

A user who labels one pass of the event and a few frames before it gets a filter that no fold can validate
(models.training.fold_plan). Its operating point then comes from its own training frames, which it separates at
almost any threshold. This check trains the filter twice from the same seed (the same model: without folds the
training is deterministic) and ships it both ways, at the threshold those frames choose
(models.crossval.choose_operating_point, as before 2026-12-05) and at the model's own boundary
(models.crossval.FINAL_THRESHOLD, k-of-n still from the training frames), and replays both over the case's test
frames. The cases are bench/tap_rule.py's, each trained only on its first occurrence and the LEAD frames before it
(a rule fixed before any score was seen; a case whose span has no frame without the event is skipped).

    python bench/few_labels.py --seeds 0-2 --sizes half,default
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from generalization import open_clip
from tap_rule import CASES, Case, add_case_arguments, candidate_config, case_clip, chosen_cases

from edge.replay import replay
from models.crossval import FINAL_THRESHOLD
from models.datasets import LabelledDataset
from models.evaluation import BOUNDARY_TOLERANCE, event_f1, runs
from models.training import train_mc

log = logging.getLogger("bench.few_labels")

LEAD = 3  # frames without the event before the first occurrence: a few, as a user labels the start of a pass
SHIPPED = {"training frames' threshold": None, "own threshold": FINAL_THRESHOLD}


def first_occurrence(case: Case, dataset: LabelledDataset) -> tuple[int, int] | None:
    """The case's first occurrence and the LEAD frames before it, as START:STOP; None without a negative frame."""
    labels = dataset.labels[case.event][: case.train_stop]
    first, last = next((a, b) for a, b in runs(labels == 1))
    span = (max(0, first - LEAD), last + 1)
    return span if (labels[span[0] : span[1]] == 0).any() else None


def run_case(case: Case, dataset: LabelledDataset, size: str, seeds: Sequence[int]) -> list[dict[str, float]]:
    """Test event F1 of the mid candidate (the default filter's pick when neither candidate can be validated) per
    seed, shipped both ways."""
    span = first_occurrence(case, dataset)
    if span is None:
        log.info("%s %s: skipped, no frame without the event before its first occurrence ends", case.clip, case.event)
        return []
    test = (case.train_stop, case.test_stop)
    with tempfile.TemporaryDirectory(prefix="ff-few-labels-") as folder:
        bundles: dict[Path, tuple[int, str]] = {}
        for seed in seeds:
            config = candidate_config(case, dataset, size, ("full_frame", "mid"), seed, None, name="x")
            for label, threshold in SHIPPED.items():
                name = f"{case.event}-{seed}-{'own' if threshold else 'fitted'}".replace("_", "-")
                bundle = Path(folder) / name
                trained = dataclasses.replace(config, frames=span, name=name)
                spec = train_mc(dataset, trained, bundle, progress=False, final_threshold=threshold).spec
                log.info(
                    "%s %s %s seed %d: threshold %.3g", case.clip, case.event, size, seed, spec.smoothing.threshold
                )
                bundles[bundle] = (seed, label)
        sink = replay(dataset, list(bundles), test, progress=False, gate=None)
    truth = dataset.labels[case.event][test[0] : test[1]]
    by_seed: dict[int, dict[str, float]] = {}
    for bundle, (seed, label) in bundles.items():
        predicted = np.zeros(test[1] - test[0], bool)
        predicted[np.asarray(sorted(sink.frames.get(bundle.name, ())), int) - test[0]] = True
        by_seed.setdefault(seed, {})[label] = event_f1(truth, predicted, BOUNDARY_TOLERANCE).f1
    for seed, scores in by_seed.items():
        cells = "  ".join(f"{label} {f1:.3f}" for label, f1 in scores.items())
        print(f"{case.clip} {case.event} {size} frames {span[0]}:{span[1]} seed {seed}: {cells}", flush=True)
    return list(by_seed.values())


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_arguments(parser, (0, 1, 2))
    args = parser.parse_args(argv)
    outcomes: list[dict[str, float]] = []
    for case in chosen_cases(CASES, args.cases):
        dataset = open_clip(case_clip(case), args.data)
        for size in args.sizes.split(","):
            outcomes += run_case(case, dataset, size, args.seeds)
    print(f"\n{'shipped at':<28} {'test F1 mean':>12} {'worst':>6}  ({len(outcomes)} outcomes)")
    for label in SHIPPED:
        taken = [scores[label] for scores in outcomes]
        print(f"{label:<28} {statistics.fmean(taken):12.3f} {min(taken):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
