"""The default filter: every candidate MC kind cross-validated on the training frames, the best one trained.

A candidate is an architecture on a tap. The full-frame MC (a classifier at every cell, max over the cells
of the region) finds its event wherever in the region it happens next, so it is the candidate on both the
late tap (coarse cells, more semantic) and the mid tap (cells a quarter the size: small objects and region
edges). The paper's localized and windowed MCs learn positions in a fully connected layer and miss later
occurrences that happen elsewhere in the region; they stay available by name (`--arch`).

All candidates' features come from one base-DNN pass; each candidate is cross-validated (models/crossval.py) and
the one with the best held-out event F1 is trained on every training frame. Near ties go to the earlier candidate.
Every candidate is DRAWS independently seeded ensembles of ENSEMBLE members each (models.microclassifiers.Ensemble)
that must all fire, and reads cells around the event's region, so that an object beside the region, whose response
peaks outside it, does not count (models/microclassifiers.py FullFrame): AUTO_CONTEXT cells, or the region's own if
it has more. The trained filter keeps the held-out k-of-n at its own threshold (models.crossval.FINAL_THRESHOLD),
and the estimate that chooses a candidate is measured at that operating point: a candidate whose fold models find
the held-out occurrences only below it would ship a filter that misses them (bench README, the selection
criterion).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from models.crossval import FINAL_THRESHOLD, CrossValidation
from models.datasets.labelled import LabelledDataset
from models.features import FeatureRequest, cached_features
from models.filterspec import Validation
from models.mc_kinds import AUTO_CONTEXT
from models.training import (
    TrainConfig,
    TrainingData,
    TrainResult,
    check_config,
    cross_validate,
    finish_training,
    fit_mc,
    load_training_data,
)

log = logging.getLogger(__name__)

CANDIDATES: tuple[tuple[str, str], ...] = (("full_frame", "mid"), ("full_frame", "late"))
# A candidate must beat an earlier one by more than this held-out event F1 to be chosen over it.
TIE = 0.02
# Members of the default filter: the same steps spread over three seeds, so one seed that misses a new
# occurrence is outvoted (on the benchmark, single seeds failed outright one time in five).
ENSEMBLE = 3
# Independently seeded ensembles in the filter, which reports a frame only where all of them do: the misses left
# were filters firing on look-alikes with held-out estimates near 1.00, and two draws seldom share their
# look-alikes (bench/draw_combination.py: on the development cases, worst test F1 0.648 -> 0.877 at the default
# input size, 0.686 -> 0.707 at half of it, against keeping the draw with the better estimate). Decided on two seed
# pairs; on eight the better draw wins at both sizes (bench README): this is to be revisited with the benchmark.
DRAWS = 2


@dataclass(frozen=True)
class CandidateEstimate:
    architecture: str
    tap: str
    validation: Validation | None


@dataclass(frozen=True)
class Choice:
    config: TrainConfig  # the chosen candidate
    candidates: list[CandidateEstimate]
    data: TrainingData  # its training data
    validation: CrossValidation | None  # its cross-validation


def choose_kind(
    dataset: LabelledDataset, config: TrainConfig, model_path: Path | None = None, progress: bool = True
) -> Choice:
    """Cross-validate each candidate kind (config's architecture and tap are ignored) and pick the best."""
    roi = config.roi.with_context(max(config.roi.context, AUTO_CONTEXT))
    configs = [
        dataclasses.replace(config, architecture=arch, tap=tap, ensemble=ENSEMBLE, draws=DRAWS, roi=roi)
        for arch, tap in CANDIDATES
    ]
    for candidate in configs:
        check_config(dataset, candidate)
    start, stop = config.frames or (0, dataset.n_frames)
    requests = [FeatureRequest(c.tap_name, c.roi) for c in configs]
    cached_features(dataset, requests, config.input_size, (start, stop), model_path, progress=progress)
    estimates, best = [], None
    for candidate in configs:
        data = load_training_data(dataset, candidate, model_path, progress=False)
        fit = partial(fit_mc, candidate, progress=False)
        validation = cross_validate(data, candidate, fit, threshold=FINAL_THRESHOLD)
        estimate = validation.validation if validation else None
        estimates.append(CandidateEstimate(candidate.architecture, candidate.tap_name, estimate))
        log.info(
            "%s on %s: held-out event F1 %s",
            candidate.architecture,
            candidate.tap_name,
            f"{estimate.event_f1:.3f}" if estimate else "not measurable",
        )
        score = estimate.event_f1 if estimate else -1.0
        if best is None or score > best[0] + TIE:
            best = (score, candidate, data, validation)
    _, chosen, data, validation = best
    return Choice(chosen, estimates, data, validation)


def train_default(
    dataset: LabelledDataset,
    config: TrainConfig,
    out_dir: Path,
    model_path: Path | None = None,
    progress: bool = True,
) -> tuple[TrainResult, list[CandidateEstimate]]:
    """The default filter: the best candidate kind, trained on every training frame, its bundle written."""
    choice = choose_kind(dataset, config, model_path, progress)
    model, losses = fit_mc(choice.config, choice.data, progress)
    result = finish_training(model, choice.data, choice.config, out_dir, model_path, losses, choice.validation)
    return result, choice.candidates
