"""Cross-validation over time on the training frames: how a filter will do on footage it was not trained on.

A filter is judged on later footage, and on later occurrences of its event, so the folds hold out time, never
random frames (neighbouring frames are near copies and would make any model look perfect):

* two or more separate occurrences in the training frames: each fold holds out whole occurrences with the
  frames around them (cut half-way through the gaps between occurrences) and trains on the others;
* one occurrence (or occurrences no fold can hold out whole, see plan_folds): its frames and the negative frames
  are each cut into contiguous thirds and each fold holds out one third of both. The estimate then measures the
  rest of an occurrence the filter has seen part of, not a new one, and says so.

A guard band of frames around the held-out frames is left out of the fold's training frames as well. Every
training frame is scored once by a model that never saw it (out of fold), and those scores choose the
operating point (threshold and k-of-n) that the final model (trained on every training frame) ships with and
that the estimate is measured at. The default filter's final model ships with that k-of-n at its own threshold
instead (FINAL_THRESHOLD): the fold models' threshold did not carry over to it. Its estimate is then measured at
that threshold too, so that of two filters the one whose held-out frames do well at the point it ships with
is kept (models/model_selection.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from models.datasets.labelled import UNCERTAIN
from models.evaluation import BOUNDARY_TOLERANCE, EventScores, event_f1, runs
from models.filterspec import Smoothing, Validation
from models.smoother import smooth_scores

MAX_FOLDS = 4
BLOCKS = 3  # folds when the training frames hold one occurrence
# Candidate operating points. Thresholds are spread evenly in logit space: scores on new footage often sit far
# from 0.5, and a grid in probability space would have nothing between 0.95 and 1.
LOGITS = np.linspace(-9.0, 9.0, 73)
THRESHOLDS = 1.0 / (1.0 + np.exp(-LOGITS))
SMOOTHINGS = ((1, 1), (2, 3), (3, 5), (4, 7))
# A threshold is judged by the worst event F1 within this many logits of it: scores on new footage shift
# (a new occurrence scores lower than the ones trained on), so a threshold whose neighbours fail is fragile.
ROBUST_LOGITS = 1.0
# Operating points within this much of the best such F1 are as good as the best; the middle one of them (by
# threshold) is taken, as far as possible from both ends of the range that worked on held-out frames.
F1_TIE = 0.01
# The default filter's threshold. The held-out scores come from the fold models, which saw less and score new
# frames closer together than the final model (trained on every training frame) does: a threshold chosen between
# their overlapping scores sat beside the final model's positives, above its scores of a new occurrence, and the
# filter missed it (bench README, tap_rule.py). Every MC trains on balanced batches, so its own boundary between
# the classes is probability 0.5; the held-out scores still choose k-of-n and give the estimate. Measured on the
# default filter's ensembles only, so `--arch` filters keep the held-out threshold.
FINAL_THRESHOLD = 0.5
MIN_FRAMES = 20  # fewer frames with (or without) the event than this: too few to trust, whatever the estimate says
LOW_F1 = 0.8  # below this estimate, the warnings list the held-out frames the filter got wrong


@dataclass(frozen=True)
class Fold:
    held_out: np.ndarray  # frames scored by a model trained without them, in order
    train: np.ndarray  # frames that model trains on: the rest, minus a guard band around the held-out frames


@dataclass(frozen=True)
class FoldPlan:
    folds: tuple[Fold, ...]
    occurrences: int  # separate occurrences of the event in the training frames
    method: str  # "occurrences" (whole occurrences held out) or "blocks" (one occurrence cut in thirds)
    runs: int  # runs of positive frames, before those closer than merge_gap were joined into occurrences
    merge_gap: int


@dataclass(frozen=True)
class OperatingPoint:
    threshold: float
    k: int
    n: int

    @property
    def smoothing(self) -> Smoothing:
        return Smoothing(threshold=self.threshold, k=self.k, n=self.n)

    def at(self, threshold: float | None) -> OperatingPoint:
        """The same k-of-n at `threshold` (None: unchanged)."""
        return self if threshold is None else replace(self, threshold=threshold)

    def apply(self, scores: np.ndarray) -> np.ndarray:
        return smooth_scores(scores, self.threshold, self.k, self.n)


def occurrences(labels: np.ndarray, span: tuple[int, int], merge_gap: int) -> list[tuple[int, int]]:
    """Separate occurrences (first, last frame) of the event in frames span[0]..span[1]-1; runs of positives
    closer than `merge_gap` frames are one occurrence (somebody stepping on the region's edge)."""
    start, stop = span
    values = labels[start:stop]
    certain = np.flatnonzero(values != UNCERTAIN)
    merged: list[tuple[int, int]] = []
    for first, last in runs(values[certain] == 1):
        first, last = start + int(certain[first]), start + int(certain[last])
        if merged and first - merged[-1][1] <= merge_gap:
            merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def plan_folds(labels: np.ndarray, span: tuple[int, int], merge_gap: int, guard: int) -> FoldPlan:
    """Folds over the training frames (see the module docstring); folds whose training part lacks positives or
    negatives are dropped, so a plan may hold fewer than two folds when the data is too thin to validate.

    Occurrences whose frames without the event all lie on one side (an occurrence labelled up to the end of the
    labelled frames, as a feedback round's "right" event can be) leave a fold that trains on positives only; then
    the occurrences are cut in thirds as a single one's would be, so the filter is still validated."""
    found = occurrences(labels, span, merge_gap)
    runs = len(occurrences(labels, span, merge_gap=0))
    folds = _folds(_occurrence_blocks(found, span), labels, span, guard) if len(found) >= 2 else []
    if len(folds) >= 2:
        return FoldPlan(tuple(folds), len(found), "occurrences", runs, merge_gap)
    blocks = _folds(_class_blocks(labels, span), labels, span, guard)
    if not any((labels[fold.held_out] == 1).any() for fold in blocks):
        blocks = []  # no fold holds out a positive (one positive frame): an event F1 over no events is 1.0
    return FoldPlan(tuple(blocks), len(found), "blocks", runs, merge_gap)


def _folds(blocks: list[np.ndarray], labels: np.ndarray, span: tuple[int, int], guard: int) -> list[Fold]:
    """A fold per held-out block whose training part (outside the guard band) holds both classes."""
    folds = []
    for held_out in blocks:
        train = _outside_guard(held_out, span, guard)
        values = labels[train]
        if held_out.size and (values == 1).any() and (values == 0).any():
            folds.append(Fold(held_out, train[values != UNCERTAIN]))
    return folds


def _occurrence_blocks(found: list[tuple[int, int]], span: tuple[int, int]) -> list[np.ndarray]:
    """Contiguous blocks of whole occurrences, cut half-way through the gaps between them."""
    groups = np.array_split(np.arange(len(found)), min(len(found), MAX_FOLDS))
    cuts = [span[0]]
    for group in groups[:-1]:
        last, following = found[group[-1]][1], found[group[-1] + 1][0]
        cuts.append((last + following + 1) // 2)
    cuts.append(span[1])
    return [np.arange(a, b) for a, b in itertools.pairwise(cuts)]


def _class_blocks(labels: np.ndarray, span: tuple[int, int]) -> list[np.ndarray]:
    """Positives and negatives each cut into contiguous thirds; block i holds third i of both."""
    frames = np.arange(*span)
    values = labels[frames]
    positives = np.array_split(frames[values == 1], BLOCKS)
    negatives = np.array_split(frames[values == 0], BLOCKS)
    return [np.sort(np.concatenate([p, n])) for p, n in zip(positives, negatives, strict=True)]


def _outside_guard(held_out: np.ndarray, span: tuple[int, int], guard: int) -> np.ndarray:
    start, stop = span
    near = np.zeros(stop - start, dtype=bool)
    inside = np.zeros(stop - start, dtype=bool)
    inside[held_out - start] = True
    for first, last in runs(inside):
        near[max(0, first - guard) : last + guard + 1] = True
    return start + np.flatnonzero(~near)


def choose_operating_point(
    scores: np.ndarray, labels: np.ndarray, tolerance: int = BOUNDARY_TOLERANCE
) -> tuple[OperatingPoint, float]:
    """The operating point for out-of-fold `scores` (NaN = not scored) and its event F1 there.

    Each candidate is judged by its robust F1, the worst within ROBUST_LOGITS of its threshold at the same
    k-of-n; among those within F1_TIE of the best robust F1, the one with the middle threshold is taken.
    """
    scored = ~np.isnan(scores)
    scores, labels = scores[scored], labels[scored]
    candidates = []  # (robust F1, threshold, k, n, F1)
    for k, n in SMOOTHINGS:
        f1 = np.array([event_f1(labels, smooth_scores(scores, float(t), k, n), tolerance).f1 for t in THRESHOLDS])
        robust = [f1[np.abs(LOGITS - logit) <= ROBUST_LOGITS + 1e-9].min() for logit in LOGITS]
        candidates += zip(robust, THRESHOLDS.tolist(), itertools.repeat(k), itertools.repeat(n), f1, strict=False)
    best = max(c[0] for c in candidates)
    near_best = sorted((c for c in candidates if c[0] >= best - F1_TIE), key=lambda c: (c[1], c[2]))
    _, threshold, k, n, f1 = near_best[len(near_best) // 2]
    return OperatingPoint(threshold, k, n), float(f1)


def fold_scores(
    plan: FoldPlan, scores: np.ndarray, labels: np.ndarray, point: OperatingPoint, tolerance: int
) -> list[EventScores]:
    """Event scores of each fold's held-out frames at one operating point (smoothing restarts per block)."""
    return [event_f1(labels[f.held_out], _piecewise(point, scores, f.held_out), tolerance) for f in plan.folds]


def _piecewise(point: OperatingPoint, scores: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """Smoothed decisions over `frames`, restarting the smoother wherever the frames skip."""
    breaks = np.flatnonzero(np.diff(frames) != 1) + 1
    return np.concatenate([point.apply(scores[piece]) for piece in np.split(frames, breaks)])


@dataclass(frozen=True)
class CrossValidation:
    plan: FoldPlan
    scores: np.ndarray  # out-of-fold score per frame index (NaN: not scored)
    point: OperatingPoint  # what the final model ships with and the estimate is measured at
    validation: Validation


def summarize(
    plan: FoldPlan,
    scores: np.ndarray,
    labels: np.ndarray,
    n_positive: int,
    tolerance: int = BOUNDARY_TOLERANCE,
    threshold: float | None = None,
    point: OperatingPoint | None = None,
) -> CrossValidation:
    """The operating point chosen on the out-of-fold scores (or `point`, if given), its threshold replaced by
    `threshold` if given (the final model's own, FINAL_THRESHOLD), and what it scored on each fold.

    `scores` and `labels` are indexed by frame (NaN and -1 outside the folds' held-out frames)."""
    point = (point or choose_operating_point(scores, labels, tolerance)[0]).at(threshold)
    held_out = np.sort(np.concatenate([fold.held_out for fold in plan.folds]))
    pooled = event_f1(labels[held_out], _piecewise(point, scores, held_out), tolerance)
    per_fold = [s.f1 for s in fold_scores(plan, scores, labels, point, tolerance)]
    validation = Validation(
        event_f1=round(pooled.f1, 4),
        f1_min=round(min(per_fold), 4),
        f1_max=round(max(per_fold), 4),
        precision=round(pooled.precision, 4),
        event_recall=round(pooled.event_recall, 4),
        folds=len(plan.folds),
        occurrences=plan.occurrences,
        method=plan.method,
        warnings=tuple(_warnings(plan, scores, labels, point, pooled.f1, n_positive, held_out)),
    )
    return CrossValidation(plan, scores, point, validation)


def _warnings(
    plan: FoldPlan,
    scores: np.ndarray,
    labels: np.ndarray,
    point: OperatingPoint,
    f1: float,
    n_positive: int,
    held_out: np.ndarray,
) -> list[str]:
    """Plain reasons not to trust the filter yet, each with what to label next."""
    warnings = []
    if plan.method == "blocks" and plan.occurrences < 2:
        joined = (
            f" (its {plan.runs} runs of frames are at most {plan.merge_gap} frames apart, so they count as one)"
            if plan.runs > 1
            else ""
        )
        warnings.append(
            f"the training frames hold one occurrence of the event{joined}, so the estimate is for the rest of that "
            "occurrence, not for a new one: label frames with another occurrence (another time, another object) "
            "and train again"
        )
    elif plan.method == "blocks":
        warnings.append(
            "no whole occurrence could be held out (the frames without the event lie on one side of them), so the "
            "estimate is for parts of occurrences the filter has seen: label frames without the event between and "
            "after the occurrences and train again"
        )
    warnings += _few_frames(n_positive)
    if f1 < LOW_F1:
        predicted = _piecewise(point, scores, held_out)
        truth = labels[held_out] == 1
        false_alarms = _ranges(held_out, predicted & (labels[held_out] == 0))
        missed = [
            (a, b) for a, b in _ranges(held_out, truth) if not predicted[np.isin(held_out, np.arange(a, b + 1))].any()
        ]
        if false_alarms:
            warnings.append(
                f"held-out frames {_listed(false_alarms)} fired without the event: label more frames like them "
                "(the same scene without the event) so the filter learns what is not it"
            )
        if missed:
            warnings.append(
                f"the occurrence(s) at frames {_listed(missed)} were missed when held out: label more occurrences "
                "that look like them"
            )
    return warnings


def unvalidated_warnings(n_positive: int, n_negative: int) -> list[str]:
    """Why a filter that could not be cross-validated is not to be trusted yet, and what to label next."""
    return [
        "no cross-validation: the training frames are too few to hold an occurrence of the event out, so there is no "
        "estimate for new footage: label more occurrences (another time, another place in the region) and frames "
        "without the event, then train again",
        *_few_frames(n_positive, n_negative),
    ]


def _few_frames(n_positive: int, n_negative: int | None = None) -> list[str]:
    warnings = []
    if n_positive < MIN_FRAMES:
        warnings.append(f"only {n_positive} frames show the event: label at least {MIN_FRAMES}")
    if n_negative is not None and n_negative < MIN_FRAMES:
        warnings.append(
            f"only {n_negative} frames are without the event: label at least {MIN_FRAMES} (the same scene without it)"
        )
    return warnings


def _ranges(frames: np.ndarray, mask: np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive frame indices where mask is True, as (first, last)."""
    chosen = frames[mask]
    if not chosen.size:
        return []
    breaks = np.flatnonzero(np.diff(chosen) != 1) + 1
    return [(int(piece[0]), int(piece[-1])) for piece in np.split(chosen, breaks)]


def _listed(ranges: list[tuple[int, int]], most: int = 3) -> str:
    shown = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in ranges[:most])
    return shown + (f" and {len(ranges) - most} more" if len(ranges) > most else "")
