"""Development check: how many seeded draws should the default filter cross-validate per candidate?

On bench/tap_rule.py's cases (inside the benchmark's training prefixes, or clips it does not use: no benchmark test
frame is read), each candidate of the default filter is cross-validated and trained from every seed of --seeds as
models/model_selection.py does (feature_variants.train_draw, the tap as is). Then, for k = 1, 2, 3 and every
k-subset of those seeds, the filter the default rule would ship: per candidate the draw with the best estimate in
the subset (the first on a tie), then the tap rule. Averaging over every subset, rather than over a few disjoint
pairs, measures what keeping the best of k draws is worth without depending on which seeds were paired.

    cd bench && ../.venv/bin/python draw_count.py --seeds 0-5 --sizes half,default
    cd bench && ../.venv/bin/python draw_count.py --seeds 0-5 --sizes default --context 3   # another neighbourhood
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
from collections.abc import Sequence

from feature_variants import VARIANTS, train_draw
from generalization import open_clip
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

from models.datasets import LabelledDataset
from models.evaluation import BOUNDARY_TOLERANCE, event_f1
from models.model_selection import CANDIDATES

COUNTS = (1, 2, 3)
WEAK = 0.8  # an outcome below this test event F1 misses issue 9's worst-seed target

Outcome = tuple[float, float]  # a draw's cross-validated estimate and its test event F1 as shipped


def case_draws(
    case: Case, dataset: LabelledDataset, size: str, seeds: Sequence[int], context: int | None = None
) -> dict[str, list[Outcome]]:
    """Candidate -> (estimate, test F1) of its draw from each seed; empty where the case does not cross-validate.
    `context`: cells around the region (and the peak neighbourhood's reach); None: the default filter's."""
    truth = dataset.labels[case.event][case.train_stop : case.test_stop]
    draws: dict[str, list[Outcome]] = {}
    for candidate in CANDIDATES:
        outcomes = []
        for seed in seeds:
            config = candidate_config(case, dataset, size, candidate, seed, context)
            draw = train_draw(case, dataset, config, VARIANTS["as is"])
            if draw.validation is None:
                return {}
            f1 = event_f1(truth, draw.point.apply(draw.test_scores), BOUNDARY_TOLERANCE).f1
            outcomes.append((draw.validation.validation.event_f1, f1))
        draws[candidate_name(*candidate)] = outcomes
    return draws


def kept_f1s(draws: dict[str, list[Outcome]], count: int) -> list[float]:
    """Test F1 of the shipped filter for every `count`-subset of the seeds."""
    found = []
    for subset in itertools.combinations(range(len(next(iter(draws.values())))), count):
        kept = {name: max((outcomes[i] for i in subset), key=lambda o: o[0]) for name, outcomes in draws.items()}
        found.append(kept[DEFAULT_RULE({name: outcome[0] for name, outcome in kept.items()})][1])
    return found


def report(size: str, cases: dict[str, dict[str, list[Outcome]]]) -> None:
    for count in COUNTS:
        per_case = {name: kept_f1s(draws, count) for name, draws in cases.items()}
        every = [f1 for f1s in per_case.values() for f1 in f1s]
        worst_case = min(per_case, key=lambda name: statistics.fmean(per_case[name]))
        print(
            f"{size:<7} best of {count}: mean {statistics.fmean(every):.3f}, below {WEAK} "
            f"{sum(f1 < WEAK for f1 in every) / len(every):.1%}, worst case {worst_case} "
            f"{statistics.fmean(per_case[worst_case]):.3f} on average, worst outcome {min(every):.3f} "
            f"({len(every)} outcomes)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_arguments(parser, (0, 1, 2, 3, 4, 5))
    parser.add_argument("--context", type=int, help="cells around each region (default: the default filter's)")
    args = parser.parse_args(argv)
    if len(args.seeds) < max(COUNTS):
        parser.error(f"--seeds needs at least {max(COUNTS)} seeds")
    for size in args.sizes.split(","):
        cases = {}
        for case in chosen_cases(CASES, args.cases):
            draws = case_draws(case, open_clip(case_clip(case), args.data), size, args.seeds, args.context)
            if draws:
                cases[f"{case.clip} {case.event}"] = draws
                cells = "  ".join(f"{name} " + ",".join(f"{e:.4f}/{f:.3f}" for e, f in o) for name, o in draws.items())
                print(f"{case.clip} {case.event:<22} {size:<7} estimate/test F1 per seed: {cells}", flush=True)
        report(size, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
