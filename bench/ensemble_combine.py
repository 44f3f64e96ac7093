"""Development check of how the default filter's seed ensemble combines its members, off the benchmark.

The default filter averages its members' logits (models.microclassifiers.Ensemble). A member that is confidently
wrong on a new occurrence (a logit far below the others') then outvotes the rest. Two alternatives are scored
here: the members' probabilities averaged, and the median member's logit. Each member is cross-validated and
trained exactly as inside the ensemble (same seeds and steps), so every combination gets its own operating point
from the combined out-of-fold scores, as the default filter's training chooses one.

Cases: bench/tap_rule.py's four (inside the benchmark's training prefixes) and one more of the same kind for the
continuation of a single occurrence (the failure of the benchmark's red car, which must not be read here):
car `white_vehicle_present`, train 0:80 (the first white car's first 26 frames), test 80:180 (the rest of its
pass, the exposure change while it is in view, and the empty lot). Candidate tap as the default filter chooses it.

    cd bench && ../.venv/bin/python ensemble_combine.py --seeds 0-2 --size half
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import numpy as np
from generalization import input_size, open_clip
from tap_alternatives import dev_arguments, logit, run_checks, sigmoid
from tap_rule import CASES, CONTINUATION, Case, case_clip

from models.crossval import choose_operating_point, summarize
from models.evaluation import BOUNDARY_TOLERANCE, event_f1
from models.model_selection import CANDIDATES, ENSEMBLE, TIE
from models.training import ENSEMBLE_SEED_STEP, TrainConfig, cross_validate, fit_mc, load_training_data, predict

Combine = Callable[[np.ndarray], np.ndarray]  # members' logits [M, N] -> one score per frame (probability)


COMBINE: dict[str, Combine] = {
    "mean logit": lambda logits: sigmoid(logits.mean(axis=0)),
    "mean prob": lambda logits: sigmoid(logits).mean(axis=0),
    "median logit": lambda logits: sigmoid(np.median(logits, axis=0)),
}


def members(case: Case, dataset, config: TrainConfig) -> tuple[np.ndarray, np.ndarray, float]:
    """Out-of-fold and test logits of each member [M, frames], and the ensemble's cross-validated F1 (its
    out-of-fold scores are the members' logits averaged: the same models as the ensemble's folds train)."""
    train = load_training_data(dataset, config, progress=False)
    every = load_training_data(dataset, dataclasses.replace(config, frames=(0, case.test_stop)), progress=False)
    test = np.arange(case.train_stop, case.test_stop)
    oof, tested, plan = [], [], None
    for index in range(ENSEMBLE):
        member = dataclasses.replace(
            config, seed=config.seed + ENSEMBLE_SEED_STEP * index, steps=config.member_steps(index), ensemble=1
        )
        validation = cross_validate(train, member, partial(fit_mc, member, progress=False))
        model, _ = fit_mc(member, train, progress=False)
        oof.append(logit(validation.scores))
        plan = validation.plan
        tested.append(logit(predict(model, every, test)))
    oof = np.stack(oof)
    estimate = summarize(plan, COMBINE["mean logit"](oof), train.frame_labels(), int(train.targets.sum()))
    return oof, np.stack(tested), estimate.validation.event_f1


def run_case(case: Case, size: tuple[int, int], seed: int, data: Path) -> dict[str, float]:
    dataset = open_clip(case_clip(case), data)
    labels = np.asarray(dataset.labels[case.event][: case.train_stop])
    truth = dataset.labels[case.event][case.train_stop : case.test_stop]
    per_tap = {}
    for architecture, tap in CANDIDATES:
        config = TrainConfig(
            event=case.event,
            architecture=architecture,
            tap=tap,
            input_size=size,
            roi=dataset.roi(case.event),
            frames=(0, case.train_stop),
            seed=seed,
            ensemble=ENSEMBLE,
        )
        per_tap[tap] = members(case, dataset, config)
    first, second = (tap for _, tap in CANDIDATES)
    tap = second if per_tap[second][2] > per_tap[first][2] + TIE else first
    oof, tested, _ = per_tap[tap]
    out = {}
    for name, combine in COMBINE.items():
        point, _ = choose_operating_point(combine(oof), labels)
        out[name] = event_f1(truth, point.apply(combine(tested)), BOUNDARY_TOLERANCE).f1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = dev_arguments(__doc__, argv)

    def outcome(case: Case) -> Iterator[tuple[int, dict[str, float]]]:
        size = input_size(open_clip(case_clip(case), args.data), args.size)
        for seed in args.seeds:
            yield seed, run_case(case, size, seed, args.data)

    run_checks((*CASES, CONTINUATION), list(COMBINE), 12, outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
