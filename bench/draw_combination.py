"""Development check: should the default filter keep both of its draws instead of the one with the better estimate?

On bench/tap_rule.py's cases (inside the benchmark's training prefixes, or clips it does not use: no benchmark test
frame is read), each candidate of the default filter is cross-validated and trained from two seeds (s, s+1) as
models/model_selection.py does (feature_variants.train_draw, the tap as is). Per seed pair, three filters:

* `select`: the default filter's rule (models.model_selection.best_draws, here of two draws), the draw with the
  better estimate per candidate, then the tap rule;
* `min`: both draws in the filter, a frame's logit the lower of the two ensembles' (both must fire): what it shipped
  from 2026-12-03 to 2026-12-04 (bench README);
* `mean`: both draws, the mean of the two logits;
* `either`: per candidate, `min` or the draw `select` keeps, whichever has the higher estimate (`min` on a tie).

A combination is judged like a draw: its out-of-fold scores (the two draws' combined per frame, over the same
folds) choose k-of-n at the final model's own threshold and give the estimate the tap rule compares; its test
scores are the two final models' combined.

    cd bench && ../.venv/bin/python draw_combination.py --seeds 0-3 --sizes half,default
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from collections.abc import Callable, Sequence

import numpy as np
from feature_variants import VARIANTS, Draw, train_draw
from generalization import open_clip
from tap_alternatives import logit, sigmoid
from tap_rule import (
    CASES,
    DEFAULT_RULE,
    Case,
    add_case_arguments,
    candidate_config,
    candidate_name,
    case_clip,
    chosen_cases,
)

from models.crossval import FINAL_THRESHOLD, summarize
from models.datasets import LabelledDataset
from models.evaluation import BOUNDARY_TOLERANCE, event_f1
from models.model_selection import CANDIDATES

Combine = Callable[[np.ndarray, np.ndarray], np.ndarray]  # two logit arrays -> one
COMBINATIONS: dict[str, Combine] = {"min": np.minimum, "mean": lambda a, b: (a + b) / 2}


def both(first: Draw, second: Draw, combine: Combine) -> tuple[float, np.ndarray]:
    """The two draws as one filter: its estimate at the point it ships with, and its decisions on the test frames."""
    assert first.validation is not None and second.validation is not None
    scores = sigmoid(combine(logit(first.validation.scores), logit(second.validation.scores)))  # NaN stays NaN
    validation = summarize(
        first.validation.plan, scores, first.labels, int((first.labels == 1).sum()), threshold=FINAL_THRESHOLD
    )
    test = sigmoid(combine(logit(first.test_scores), logit(second.test_scores)))
    return validation.validation.event_f1, validation.point.apply(test)


def pair_outcomes(draws: dict[str, tuple[Draw, Draw]], truth: np.ndarray) -> dict[str, float]:
    """Test event F1 of `select` and of each combination, for one seed pair (candidate -> its two draws)."""

    def f1(decisions: np.ndarray) -> float:
        return event_f1(truth, decisions, BOUNDARY_TOLERANCE).f1

    kept = {name: max(pair, key=lambda d: d.validation.validation.event_f1) for name, pair in draws.items()}
    taken = DEFAULT_RULE({name: draw.validation.validation.event_f1 for name, draw in kept.items()})
    outcomes = {"select": f1(kept[taken].point.apply(kept[taken].test_scores))}
    for label, combine in COMBINATIONS.items():
        judged = {name: both(*pair, combine) for name, pair in draws.items()}
        taken = DEFAULT_RULE({name: estimate for name, (estimate, _) in judged.items()})
        outcomes[label] = f1(judged[taken][1])
        if label == "min":
            either = {name: max(judged[name], alone(kept[name]), key=lambda option: option[0]) for name in draws}
            taken = DEFAULT_RULE({name: estimate for name, (estimate, _) in either.items()})
            outcomes["either"] = f1(either[taken][1])
    return outcomes


def alone(draw: Draw) -> tuple[float, np.ndarray]:
    """One draw as the filter: its estimate and its decisions on the test frames."""
    return draw.validation.validation.event_f1, draw.point.apply(draw.test_scores)


def run_case(case: Case, dataset: LabelledDataset, size: str, seeds: Sequence[int]) -> list[dict[str, float]]:
    truth = dataset.labels[case.event][case.train_stop : case.test_stop]
    outcomes = []
    for first, second in zip(seeds[::2], seeds[1::2], strict=False):
        draws = {}
        for candidate in CANDIDATES:
            pair = tuple(
                train_draw(case, dataset, candidate_config(case, dataset, size, candidate, s, None), VARIANTS["as is"])
                for s in (first, second)
            )
            if any(draw.validation is None for draw in pair):
                return []  # not cross-validated: nothing to choose by
            draws[candidate_name(*candidate)] = pair
        outcomes.append(pair_outcomes(draws, truth))
        cells = "  ".join(f"{name} {f1:.3f}" for name, f1 in outcomes[-1].items())
        print(f"{case.clip} {case.event:<22} {size:<7} seeds {first},{second}: {cells}", flush=True)
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_arguments(parser, (0, 1, 2, 3))  # seeds paired in order: 0 with 1, 2 with 3
    args = parser.parse_args(argv)
    for size in args.sizes.split(","):
        found: list[dict[str, float]] = []
        for case in chosen_cases(CASES, args.cases):
            found += run_case(case, open_clip(case_clip(case), args.data), size, args.seeds)
        for name in ("select", *COMBINATIONS, "either"):
            values = [outcome[name] for outcome in found]
            if values:
                print(f"{size:<7} {name:<7} mean {statistics.fmean(values):.3f}  worst {min(values):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
