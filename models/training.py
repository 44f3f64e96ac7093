"""Train one microclassifier for one event of a labelled dataset from cached features, and write its bundle.

The pieces are small on purpose so that distributed training (models/distributed_training.py) can reuse
them: `load_training_data` (the cached crops and labels of a frame range), `BalancedSampler` (batches half
positive, half negative), `make_optimizer` (by name, with stage lengths scaled to the step budget),
`train_steps` (the loop, with optional curricula), `predict` (scores over a range), `choose_threshold` (on
the training range only) and `finish_training` (threshold, export, check, write).

Curriculum learning (Li, Zhang, He 2021) grows the difficulty of the inputs with the step, never their
shape, so every architecture and every rank trains the same graph: `window` shows a windowed MC only the
last d frames of its window (older ones masked out, as at the start of a stream), `resolution` shows the
crop average-pooled to d percent of its cells per side (then repeated back to the full grid).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from models.base_export import base_model_file
from models.base_identity import identify
from models.bundle import check_mc_model, write_bundle
from models.coverage import one_place_warning
from models.crossval import (
    CrossValidation,
    FoldPlan,
    choose_operating_point,
    plan_folds,
    summarize,
    unvalidated_warnings,
)
from models.curriculum import CurriculumScheduler
from models.datasets.labelled import UNCERTAIN, LabelledDataset
from models.errors import FilterForwardError, validation_summary
from models.evaluation import BOUNDARY_TOLERANCE, EventScores, event_f1
from models.features import FeatureRequest, cached_features, checked_range
from models.filterspec import NAME_PATTERN, BaseModelId, FilterSpec, MotionVeto, Smoothing, TrainedOn, Validation
from models.mc_export import export_mc, verify_export
from models.mc_kinds import MC_KINDS, MCKind
from models.memory import check_memory
from models.microclassifiers import Ensemble, MicroClassifier, build_mc, check_window
from models.motion import fit_veto, no_veto_reason, region_foreground, still
from models.optimizer_kinds import OPTIMIZERS
from models.progress import progress_bar
from models.roi import FULL_FRAME, ROI
from models.stopping import check_stop, request_stop, stop_requested, withdraw_stop
from models.taps import PIXEL_TAP, PIXELS, round_input_size

log = logging.getLogger(__name__)

CURRICULUM_KINDS = ("window", "resolution")
FULL_RESOLUTION = 100  # resolution difficulties are percent of the crop's cells per side
CURRICULUM_SYNTAX = {
    "fixed_linear": "KIND:fixed_linear:MIN:MAX:TOTAL_STEPS[:DIFFICULTY_STEP], e.g. window:fixed_linear:2:5:100",
    "fixed_root": "KIND:fixed_root:MIN:MAX:TOTAL_STEPS:ROOT_DEGREE[:DIFFICULTY_STEP], "
    "e.g. resolution:fixed_root:25:100:200:2",
    "fixed_discrete": "KIND:fixed_discrete:D1,D2,..:LAST_STEP1,.. (one step fewer), "
    "e.g. window:fixed_discrete:2,3,5:50,100",
}


@dataclass(frozen=True)
class Curriculum:
    """One input difficulty (`window`: frames of W shown; `resolution`: percent of cells per side) and its schedule."""

    kind: str
    scheduler: CurriculumScheduler

    @property
    def max_difficulty(self) -> int:
        return self.scheduler.config.max_difficulty

    @property
    def settled_step(self) -> int:
        """The first step at full difficulty (at the latest)."""
        config = self.scheduler.config
        if config.schedule == "fixed_discrete":
            return config.max_steps[-1] + 1 if config.max_steps else 1
        return config.total_steps


def parse_curriculum(text: str) -> Curriculum:
    """'window:fixed_linear:2:5:100' (see CURRICULUM_SYNTAX) -> a validated Curriculum."""
    kind, _, rest = text.partition(":")
    schedule, _, tail = rest.partition(":")
    values = tail.split(":") if tail else []
    if kind not in CURRICULUM_KINDS or schedule not in CURRICULUM_SYNTAX:
        raise FilterForwardError(
            f"curriculum {text!r} is not KIND:SCHEDULE:..: KIND is {' or '.join(CURRICULUM_KINDS)}, SCHEDULE one of "
            f"{', '.join(CURRICULUM_SYNTAX)}, e.g. window:fixed_linear:2:5:100"
        )
    try:
        fields = _schedule_fields(schedule, values)
    except ValueError:
        raise FilterForwardError(f"curriculum {text!r} is not valid: use {CURRICULUM_SYNTAX[schedule]}") from None
    try:
        return Curriculum(kind, CurriculumScheduler(schedule, **fields))
    except FilterForwardError as exc:
        raise FilterForwardError(f"curriculum {text!r}: {exc}") from None


def _schedule_fields(schedule: str, values: list[str]) -> dict[str, object]:
    """The scheduler's keyword arguments from the colon-separated values; ValueError on a wrong count or number."""
    if schedule == "fixed_discrete":
        if len(values) != 2:
            raise ValueError(schedule)
        difficulties = [int(v) for v in values[0].split(",")]
        max_steps = [int(v) for v in values[1].split(",")] if values[1] else []
        return {
            "min_difficulty": min(difficulties),
            "max_difficulty": max(difficulties),
            "difficulties": difficulties,
            "max_steps": max_steps,
        }
    names = ["min_difficulty", "max_difficulty", "total_steps"]
    names += ["root_degree", "difficulty_step"] if schedule == "fixed_root" else ["difficulty_step"]
    if not len(names) - 1 <= len(values) <= len(names):
        raise ValueError(schedule)
    return {name: int(value) for name, value in zip(names, values, strict=False)}


MAX_ENSEMBLE = 8
MAX_LR = 1.0  # a step this large already throws an MC's weights far off; larger is a typo
MAX_STEPS = 100_000  # hours of training at most; the step schedules are arrays this long (the cloud's bound too)
MAX_BATCH_SIZE = 4096  # crops per step: a batch of 100,000 late-tap crops took 21 GB before the OOM killer came
ENSEMBLE_SEED_STEP = 1000  # member i of an ensemble starts from seed + i * this


@dataclass(frozen=True)
class TrainConfig:
    """What to train: one MC architecture on one tap/ROI for one event, on a frame range."""

    event: str
    architecture: str
    input_size: tuple[int, int]
    tap: str | None = None  # default: the architecture's default_tap
    roi: ROI = FULL_FRAME
    frames: tuple[int, int] | None = None  # training range, stop exclusive; None: every frame
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    window: int = 5
    optimizer: str = "adam"
    curricula: tuple[Curriculum, ...] = ()
    smoothing: Smoothing = field(default_factory=Smoothing)
    name: str | None = None  # filter name; default "<event>-<architecture>"
    # Targets 0.1/0.9 instead of 0/1: the MC cannot push its training frames to scores of exactly 0 or 1, so new
    # occurrences (which always score lower than the frames it was fitted to) do not fall off a cliff.
    label_smoothing: float = 0.1
    device: str = "cpu"
    # MCs are tiny: one CPU thread is as fast as several and does not collapse when cores are shared.
    threads: int = 1
    ensemble: int = 1  # members (single-frame kinds) sharing `steps`, their median logit in one graph
    # Scale augmentation of a per-cell MC: its training frames also at these multiples of input_size (a real
    # base-DNN pass each), so that it has seen its objects larger and smaller than they were. Only the edge's
    # input size is exported and scored.
    scales: tuple[float, ...] = ()
    # Mirror augmentation of a per-cell MC: its training frames also mirrored left to right (a real base-DNN pass
    # each, every cell mirrored back to where it lies in the frame), the same events seen from the other side.
    mirror: bool = False
    # The default filter's motion veto (models/motion.py): fitted on the training frames' foreground in the region.
    motion_veto: bool = False

    def member_steps(self, index: int) -> int:
        """Steps of ensemble member `index`: the steps shared out, the first members taking one more where they do
        not divide evenly (`--steps 100` trained 99)."""
        return self.steps // self.ensemble + (index < self.steps % self.ensemble)

    @property
    def kind(self) -> MCKind:
        return MC_KINDS.lookup(self.architecture)

    @property
    def tap_name(self) -> str:
        return self.tap or self.kind.default_tap

    @property
    def context(self) -> int:
        """Frames an MC sees per decision: W for a windowed MC, else 1."""
        return self.window if self.kind.windowed else 1


@dataclass(frozen=True)
class AugmentedView:
    """The training crops at another base-DNN input size (TrainConfig.scales) or mirrored (TrainConfig.mirror)."""

    input_size: tuple[int, int]
    cells_last: np.ndarray  # float32 [n, h, w, C], row i is frame TrainingData.first + i
    mask: np.ndarray  # bool [h, w]: the crop's cells inside the region at this size


@dataclass(frozen=True)
class TrainingData:
    """Cached crops of frames `first`.. and the labels of the frames to train on (uncertain ones left out)."""

    features: np.ndarray  # fp16 [n, C, h, w]; row i is frame first + i
    first: int
    span: tuple[int, int]  # the training range, stop exclusive (first <= span[0]: windowed context)
    labels: np.ndarray  # int8 1/0/-1 of every frame of the span
    frames: np.ndarray  # frame indices of the range with a certain label
    targets: np.ndarray  # float32 0/1 per entry of `frames`
    window: int
    fps: float
    mask: np.ndarray  # bool [h, w]: the crop's cells inside the region
    cells_last: np.ndarray  # the features as float32 [n, h, w, C], in memory: what the MCs train on
    views: tuple[AugmentedView, ...] = ()  # the same frames at other input sizes or mirrored, for training only
    foreground: np.ndarray | None = None  # motion_veto: the region's foreground fraction of every frame of the span
    dataset: str = ""  # its name: the bundle records where it was trained (eval notes scores on those frames)

    @property
    def crop_chw(self) -> tuple[int, int, int]:
        return tuple(self.features.shape[1:])

    def only(self, frames: np.ndarray) -> TrainingData:
        """The same data, training on these frames only (a cross-validation fold)."""
        keep = np.isin(self.frames, frames)
        return replace(self, frames=self.frames[keep], targets=self.targets[keep])

    def frame_labels(self) -> np.ndarray:
        """Labels indexed by frame number (-1 before the span)."""
        labels = np.full(self.span[1], UNCERTAIN, dtype=np.int8)
        labels[self.span[0] :] = self.labels
        return labels

    def inputs(
        self, frames: np.ndarray, device: str = "cpu", view: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Model inputs for these frames: crops [B, C, h, w], or for windowed MCs windows [B, W, C, h, w]
        with a mask that is False for frames before frame 0 (the edge's zero history at stream start).
        View v > 0: the crops of `views[v - 1]`, with the region cells at its input size [B, h, w]."""
        if view:
            scaled = self.views[view - 1]
            cells = self._cells(scaled.cells_last, frames, device)
            return cells, torch.from_numpy(scaled.mask).to(device).expand(len(frames), *scaled.mask.shape)
        if self.window == 1:
            return self._cells(self.cells_last, frames, device), None
        offsets = frames[:, None] + np.arange(1 - self.window, 1)[None]
        valid = offsets >= 0
        rows = np.clip(offsets - self.first, 0, None)
        # [B, W, h, w, C] as [B, W, C, h, w]: each frame's 1x1 reduction then runs channels-last (1.7x a step).
        windows = torch.from_numpy(self.cells_last[rows]).to(device).permute(0, 1, 4, 2, 3)
        return windows, torch.from_numpy(valid).to(device)

    def _cells(self, cells_last: np.ndarray, frames: np.ndarray, device: str) -> torch.Tensor:
        # A channels-last view: a 1x1 conv over every cell (the full-frame MC) runs several times faster.
        return torch.from_numpy(cells_last[frames - self.first]).to(device).permute(0, 3, 1, 2)


@dataclass(frozen=True)
class TrainResult:
    spec: FilterSpec
    bundle: Path
    train_scores: EventScores  # event F1 on the training range at the chosen threshold
    losses: list[float]
    n_positive: int
    n_negative: int
    # The cross-validation the estimate came from, the motion veto applied to its held-out scores (None if none ran
    # in this process): what the studio's example frames are drawn from.
    validation: CrossValidation | None = None
    no_veto: str | None = None  # why a filter that was to carry a motion veto (TrainConfig.motion_veto) has none


def train_mc(
    dataset: LabelledDataset,
    config: TrainConfig,
    out_dir: Path,
    model_path: Path | None = None,
    progress: bool = True,
    final_threshold: float | None = None,
) -> TrainResult:
    """Cross-validate over time (which sets the operating point), train on every training frame, export to ONNX
    and write the bundle to `out_dir`. `final_threshold`: the final model's own threshold instead of the held-out
    one (what the default filter does, models.crossval.FINAL_THRESHOLD)."""
    data = load_training_data(dataset, config, model_path, progress)
    model, losses, validation = fit_and_validate(data, config, progress, final_threshold)
    return finish_training(model, data, config, out_dir, model_path, losses, validation, final_threshold)


def fit_and_validate(
    data: TrainingData, config: TrainConfig, progress: bool = True, threshold: float | None = None
) -> tuple[MicroClassifier, list[float], CrossValidation | None]:
    """The MC trained on every training frame, its losses, and the cross-validation (cross_validate), their fits
    side by side as far as the cores allow: each trains its own model on `config.threads` torch threads, so each
    trains exactly what it would alone. The final fit shows progress; the folds log theirs."""
    with fit_pool(config.threads) as pool:
        final = pool.submit(fit_mc, config, data, progress)
        validation = cross_validate(
            data, config, partial(fit_mc, config, progress=False), threshold=threshold, pool=pool
        )
        model, losses = final.result()
    return model, losses, validation


StepHook = Callable[[int, MicroClassifier], None]  # (step, the model being trained): learning curves


def fit_mc(
    config: TrainConfig,
    data: TrainingData,
    progress: bool = True,
    on_step: StepHook | None = None,
    pool: Executor | None = None,
) -> tuple[MicroClassifier, list[float]]:
    """A fresh MC trained on the data's training frames; its loss per step. With `config.ensemble` > 1, that
    many members share the steps, each from its own seed (the losses follow one another), fitted side by side in
    `pool` if given. `on_step(step, model)` runs after every optimizer step (learning curves)."""
    if config.ensemble == 1:
        return _fit_one(config, data, progress, on_step)
    members = [
        replace(config, seed=config.seed + ENSEMBLE_SEED_STEP * index, steps=config.member_steps(index), ensemble=1)
        for index in range(config.ensemble)
    ]
    fit = partial(_fit_one, data=data, progress=progress, on_step=on_step)
    fitted = list((pool.map if pool else map)(fit, members))
    return Ensemble([model for model, _ in fitted]), [loss for _, losses in fitted for loss in losses]


def _fit_one(
    config: TrainConfig, data: TrainingData, progress: bool, on_step: StepHook | None
) -> tuple[MicroClassifier, list[float]]:
    model = new_model(config, data)
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr, config.steps, config.curricula)
    sampler = BalancedSampler(data.frames, data.targets, config.batch_size, config.seed)
    hook = None if on_step is None else lambda step: on_step(step, model)
    with torch_threads(config.threads):
        losses = train_steps(Logits(model), data, optimizer, sampler, config, progress, hook)
    return model, losses


Fit = Callable[[TrainingData], tuple[MicroClassifier, list[float]]]
_INIT_LOCK = threading.Lock()


def fold_plan(data: TrainingData, config: TrainConfig, warn: bool = True) -> FoldPlan | None:
    """The folds of cross-validation over time (see models/crossval.py); None (with a warning, if `warn`) when the
    training frames cannot be split into two folds that each hold both classes and hold some of the event out."""
    # Runs of the event less than a second apart are one occurrence; frames within 0.2 s of a held-out frame
    # (near copies of it) or within a windowed MC's window are not trained on.
    merge_gap, guard = max(2, round(data.fps)), max(2, round(data.fps / 5), config.context)
    plan = plan_folds(data.frame_labels(), data.span, merge_gap=merge_gap, guard=guard)
    if len(plan.folds) < 2:
        if warn:
            log.warning(
                "cannot cross-validate %s: too few frames with and without it to hold some of each out", config.event
            )
        return None
    return plan


def cross_validate(
    data: TrainingData,
    config: TrainConfig,
    fit: Fit,
    plan: FoldPlan | None = None,
    threshold: float | None = None,
    pool: Executor | None = None,
) -> CrossValidation | None:
    """Out-of-fold scores of every training frame over `plan` (default: fold_plan's) and the operating point they
    choose (at `threshold` if given, models.crossval.summarize); None when the training frames cannot be split
    into two folds that each hold both classes. With a `pool` the folds are fitted in it."""
    if plan is None and (plan := fold_plan(data, config)) is None:
        return None
    return validate_fits(data, config, plan, fit_folds(data, plan, fit, pool), threshold)


def fit_folds(
    data: TrainingData, plan: FoldPlan, fit: Fit, pool: Executor | None = None
) -> Iterator[tuple[MicroClassifier, list[float]]]:
    """Each fold's model fitted on the fold's training frames, in order: with a `pool` every fit is submitted at
    once (so folds of other cross-validations can queue behind them), else each is fitted when it is reached."""
    return (pool.map if pool else map)(fit, [data.only(fold.train) for fold in plan.folds])


def validate_fits(
    data: TrainingData,
    config: TrainConfig,
    plan: FoldPlan,
    fitted: Iterable[tuple[MicroClassifier, list[float]]],
    threshold: float | None = None,
) -> CrossValidation:
    """The out-of-fold scores of the fold models `fitted` (fit_folds) and the operating point they choose."""
    labels = data.frame_labels()
    scores = np.full(labels.size, np.nan)
    for number, (fold, (model, losses)) in enumerate(zip(plan.folds, fitted, strict=True), start=1):
        log.info("cross-validation fold %d of %d: %d held-out frames", number, len(plan.folds), fold.held_out.size)
        check_finite(model, config)
        check_final_loss(losses, config)
        with torch_threads(config.threads):
            scores[fold.held_out] = predict(model, data, fold.held_out, device=config.device)
        check_scores(scores[fold.held_out], config)
    return summarize(plan, scores, labels, int(data.targets.sum()), threshold=threshold)


def _fit_veto(data: TrainingData, frames: np.ndarray) -> MotionVeto | None:
    """The motion veto fitted on these frames of the span (models.motion.fit_veto); None without motion_veto."""
    if data.foreground is None:
        return None
    at = frames - data.span[0]
    return fit_veto(data.foreground[at], data.labels[at])


def _with_veto(validation: CrossValidation, data: TrainingData) -> CrossValidation:
    """The estimate of the filter as it ships, its motion veto included: each fold's held-out scores with the frames
    a veto fitted on that fold's training frames holds back at 0, at the same operating point. The kind, the draw
    and the k-of-n were chosen without the veto (on the development cases, choosing them with it lost more than it
    won: bench README, "The motion veto")."""
    scores = validation.scores.copy()
    for fold in validation.plan.folds:
        scores[fold.held_out] = _vetoed(scores[fold.held_out], fold.held_out, data, _fit_veto(data, fold.train))
    n_positive = int(data.targets.sum())
    return summarize(validation.plan, scores, data.frame_labels(), n_positive, point=validation.point)


def _vetoed(scores: np.ndarray, frames: np.ndarray, data: TrainingData, veto: MotionVeto | None) -> np.ndarray:
    """`scores` of `frames` with those the veto holds back at 0, as the edge counts them."""
    if veto is None:
        return scores
    return np.where(still(data.foreground, veto)[frames - data.span[0]], 0.0, scores)


def new_model(config: TrainConfig, data: TrainingData) -> MicroClassifier:
    """A fresh MC for the data's crops, initialised from the config's seed (the same on every rank)."""
    with _INIT_LOCK:  # torch's global generator: MCs trained in parallel threads are initialised one at a time
        torch.manual_seed(config.seed)
        crop = data.crop_chw
        model = build_mc(config.architecture, crop[0], crop[1:], config.window, data.mask, config.roi.context)
    return model.to(config.device)


def finish_training(
    model: MicroClassifier,
    data: TrainingData,
    config: TrainConfig,
    out_dir: Path,
    model_path: Path | None,
    losses: list[float],
    validation: CrossValidation | None,
    final_threshold: float | None = None,
) -> TrainResult:
    """Take the cross-validated operating point (CrossValidation.point; without a cross-validation: the best on
    the training frames, its threshold `final_threshold` if given), export to ONNX and write the bundle to
    `out_dir`."""
    check_finite(model, config)
    check_final_loss(losses, config)
    frames = np.arange(*data.span)
    motion = _fit_veto(data, frames)
    with torch_threads(config.threads):
        raw = predict(model, data, frames, device=config.device)
    check_scores(raw, config)  # before the bundle's own check, which would only say the score is not a probability
    check_learned(raw, config)
    scores = _vetoed(raw, frames, data, motion)
    labels = data.frame_labels()
    if validation is None:
        # On its own training frames a model separates the classes at almost any threshold, and the middle of that
        # range can lie far below its own boundary: the default filter keeps that boundary here too.
        point, _ = choose_operating_point(np.concatenate([np.full(data.span[0], np.nan), scores]), labels)
        point = point.at(final_threshold)
    else:
        point = validation.point
    train_scores = event_f1(data.labels, point.apply(scores), BOUNDARY_TOLERANCE)
    if validation is not None and motion is not None:
        validation = _with_veto(validation, data)
    estimate = validation and _with_coverage(validation.validation, model, data, config, model_path)
    base = None if config.kind.reads_pixels else identify(base_model_file(model_path))
    n_positive, n_negative = int(data.targets.sum()), int((data.targets == 0).sum())
    warnings = () if validation else tuple(unvalidated_warnings(n_positive, n_negative))
    trained_on = TrainedOn(dataset=data.dataset, frames=data.span) if data.dataset else None
    spec = make_spec(config, point.smoothing, estimate, base, warnings, motion, trained_on)
    bundle = finish_bundle(model, spec, data.crop_chw, _tap_shape(config, model_path), out_dir)
    log.info("trained %s: train event F1 %.3f at threshold %.3g", spec.name, train_scores.f1, point.threshold)
    no_veto = None if motion or data.foreground is None else no_veto_reason(data.foreground, data.labels)
    return TrainResult(spec, bundle, train_scores, losses, n_positive, n_negative, validation, no_veto)


def _with_coverage(
    validation: Validation, model: MicroClassifier, data: TrainingData, config: TrainConfig, model_path: Path | None
) -> Validation:
    """The validation, warning also when the training frames show the event at one place of a large region."""
    positives, _ = data.inputs(data.frames[data.targets == 1], config.device)
    warning = one_place_warning(model, positives, config.roi, data.mask, _tap_shape(config, model_path)[1:])
    if warning is None:
        return validation
    log.warning("%s", warning)
    return validation.model_copy(update={"warnings": (*validation.warnings, warning)})


DIVERGED_ADVICE = "so no bundle was written: lower --lr, try another --optimizer or --seed, or train fewer --steps"


def check_finite(model: MicroClassifier, config: TrainConfig) -> None:
    """Refuse a diverged MC: a NaN or inf parameter would make every score NaN on the edge."""
    bad = sum(int((~torch.isfinite(p)).sum()) for p in model.parameters())
    if bad:
        total = sum(p.numel() for p in model.parameters())
        raise FilterForwardError(
            f"training diverged: {bad} of {total} MC parameters are NaN or inf after {config.steps} steps with "
            f"{config.optimizer}, {DIVERGED_ADVICE}"
        )


def check_final_loss(losses: list[float], config: TrainConfig) -> None:
    """Refuse an MC whose last training loss is NaN or inf: its parameters can be finite yet so large that its
    scores overflow (the compressed optimizers skip the non-finite steps, so nothing else stops them)."""
    if losses and not np.isfinite(losses[-1]):
        raise FilterForwardError(
            f"training diverged: the final training loss is {losses[-1]} after {config.steps} steps with "
            f"{config.optimizer} at lr {config.lr:g}, {DIVERGED_ADVICE}"
        )


def check_scores(scores: np.ndarray, config: TrainConfig) -> None:
    """Refuse an MC that scores a training frame NaN: diverged, even when its parameters and last loss are finite
    (an ensemble member's loss is not the last)."""
    bad = int(np.isnan(scores).sum())
    if bad:
        raise FilterForwardError(
            f"training diverged: the MC scores {bad} of {scores.size} training frames NaN after {config.steps} steps "
            f"with {config.optimizer} at lr {config.lr:g}, {DIVERGED_ADVICE}"
        )


def check_learned(scores: np.ndarray, config: TrainConfig) -> None:
    """Refuse an MC that gives every training frame the same score: it learned nothing (a step too large for it
    killed its units: 1-bit LAMB given --lr 1e-2 ends at loss ln 2), and any threshold makes it fire always or never."""
    if scores.size > 1 and np.ptp(scores) < 1e-6:
        raise FilterForwardError(
            f"training failed: the MC gives all {scores.size} training frames the same score {scores[0]:.3f} after "
            f"{config.steps} steps with {config.optimizer} at lr {config.lr:g}, {DIVERGED_ADVICE}"
        )


def check_config(dataset: LabelledDataset, config: TrainConfig) -> None:
    kind = config.kind
    dataset.require_event(config.event)
    OPTIMIZERS.lookup(config.optimizer)  # an unknown name fails here, before any work
    if (config.tap_name == PIXELS) != kind.reads_pixels:
        raise FilterForwardError(
            f"architecture {config.architecture} cannot read tap {config.tap_name!r}: only the "
            f"{_kinds_that(lambda k: k.reads_pixels)} baseline reads {PIXELS!r}, and it reads nothing else"
        )
    make_spec(config, config.smoothing)  # fails fast on a bad name or window, before any work
    if kind.windowed:
        check_window(config.window)
    check_curricula(config)
    if not 0.0 <= config.label_smoothing < 0.5:
        raise FilterForwardError(f"label smoothing must be at least 0 and below 0.5, got {config.label_smoothing}")
    if not 1 <= config.ensemble <= MAX_ENSEMBLE or (config.ensemble > 1 and config.context > 1):
        raise FilterForwardError(
            f"an ensemble has 1 to {MAX_ENSEMBLE} members of a single-frame kind, got {config.ensemble} of "
            f"{config.architecture}: lower --ensemble or use another kind"
        )
    scales = ", ".join(map(str, config.scales))
    if config.scales and not kind.cellwise:
        raise FilterForwardError(
            f"training scales {scales} need a {_kinds_that(lambda k: k.cellwise)} MC, not {config.architecture}: "
            "drop them or change the kind"
        )
    if not all(0.25 <= scale <= 4.0 for scale in config.scales):
        raise FilterForwardError(f"training scales {scales} are not all factors from 0.25 to 4: give such factors")
    if config.mirror and not kind.cellwise:  # augmented views, like scales, are built for per-cell MCs only
        raise FilterForwardError(
            f"mirrored training frames need a {_kinds_that(lambda k: k.cellwise)} MC, not {config.architecture}: "
            "drop --mirror or change the kind"
        )
    if config.roi.context and not kind.cellwise:  # other kinds zero the cells outside the region: no use to them
        raise FilterForwardError(
            f"a region's context cells are for a {_kinds_that(lambda k: k.cellwise)} MC, not {config.architecture}: "
            "drop --context or change the kind"
        )
    if not (1 <= config.steps <= MAX_STEPS and 2 <= config.batch_size <= MAX_BATCH_SIZE and config.threads >= 1):
        raise FilterForwardError(
            f"need steps from 1 to {MAX_STEPS:,}, a batch size from 2 to {MAX_BATCH_SIZE} and threads >= 1, got "
            f"{config.steps}, {config.batch_size} and {config.threads}"
        )
    if config.steps < config.ensemble:  # `--steps 1` trained 3: one for each member
        raise FilterForwardError(
            f"{config.steps} step(s) for an ensemble of {config.ensemble} models (the default filter's): give --steps "
            f"of at least {config.ensemble}"
        )
    if config.seed < 0:
        raise FilterForwardError(f"the seed must be 0 or more, got {config.seed}")
    if not 0 < config.lr <= MAX_LR:  # NaN too; torch raised its own error only once the optimizer was made
        raise FilterForwardError(f"the learning rate must be above 0 and at most {MAX_LR:g}, got {config.lr}")
    check_labels(dataset, config)
    check_memory(dataset, [config])


def check_labels(dataset: LabelledDataset, config: TrainConfig) -> None:
    """The training range needs positive and negative frames: checked before the base DNN runs over it."""
    start, stop = checked_range(dataset, config.frames)
    labels = dataset.labels[config.event][start:stop]
    n_positive, n_negative = int((labels == 1).sum()), int((labels == 0).sum())
    if n_positive == 0 or n_negative == 0:
        raise FilterForwardError(
            f"event {config.event!r} has {n_positive} positive and {n_negative} negative frames in frames "
            f"{start}:{stop} of {dataset.name}: pick a training range with both"
        )


def check_curricula(config: TrainConfig) -> None:
    """Each kind at most once, and reachable: window only on windowed MCs and at most W, resolution at most 100%."""
    kinds = [c.kind for c in config.curricula]
    if len(set(kinds)) < len(kinds):
        raise FilterForwardError(f"curricula {', '.join(kinds)} repeat a kind: give each kind at most once")
    for curriculum in config.curricula:
        if curriculum.kind == "window" and not config.kind.windowed:
            raise FilterForwardError(
                f"a window curriculum needs a windowed MC, not {config.architecture}: use --arch "
                f"{_kinds_that(lambda k: k.windowed)} or drop it"
            )
        limit = config.window if curriculum.kind == "window" else FULL_RESOLUTION
        if curriculum.max_difficulty > limit:
            raise FilterForwardError(
                f"the {curriculum.kind} curriculum goes up to {curriculum.max_difficulty}, above its limit {limit} "
                f"({'the window W' if curriculum.kind == 'window' else 'percent of the cells'}): lower its maximum"
            )


def _kinds_that(test: Callable[[MCKind], bool]) -> str:
    """The names of the MC kinds that pass the test, for a message: 'windowed', or 'a or b'."""
    return " or ".join(name for name, kind in MC_KINDS.items() if test(kind))


def usable_cores() -> int:
    """The cores this process may run on (a container's or `taskset`'s CPU set, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def fit_pool(threads: int) -> Iterator[Executor]:
    """A pool for fits of `threads` torch threads each, one per core. An exception or Ctrl-C in the thread that
    waits on it stops the fits running in it at their next step and drops the queued ones: the pool's end would
    otherwise wait minutes for fits nobody wants. That stop is withdrawn once they ended, unless one was requested
    before (a trainer's cancelled job)."""
    requested_before = stop_requested()
    try:
        with torch_threads(threads), ThreadPoolExecutor(max(1, usable_cores() // threads), "fit") as pool:
            try:
                yield pool
            except BaseException as exc:
                pool.shutdown(wait=False, cancel_futures=True)
                request_stop(f"stopped: {type(exc).__name__} in the fit's caller")
                raise
    finally:
        if not requested_before:
            withdraw_stop()


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run a block with this many torch CPU threads, then restore the previous setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def load_training_data(
    dataset: LabelledDataset, config: TrainConfig, model_path: Path | None = None, progress: bool = True
) -> TrainingData:
    """Cached crops for the training range (plus the W-1 frames before it for windowed MCs) and its labels."""
    check_config(dataset, config)
    start, stop = config.frames or (0, dataset.n_frames)
    first = max(0, start - (config.context - 1))
    request = FeatureRequest(config.tap_name, config.roi)
    cached = cached_features(dataset, [request], config.input_size, (first, stop), model_path, progress=progress)
    features = cached[request]
    labels = dataset.labels[config.event][start:stop]
    certain = np.flatnonzero(labels != UNCERTAIN)
    targets = (labels[certain] == 1).astype(np.float32)
    tap_shape = _tap_shape(config, model_path)
    mask = config.roi.cell_mask(*tap_shape[1:])
    cells_last = channels_last(features)
    augmented = [(scale, False) for scale in config.scales] + [(1.0, True)] * config.mirror
    views = tuple(
        _augmented_view(dataset, config, scale, mirrored, (first, stop), model_path, progress)
        for scale, mirrored in augmented
    )
    return TrainingData(
        features,
        first,
        (start, stop),
        labels,
        start + certain,
        targets,
        config.context,
        dataset.fps,
        mask,
        cells_last,
        views,
        region_foreground(dataset, config.roi, (start, stop)) if config.motion_veto else None,
        dataset.name,
    )


def channels_last(features: np.ndarray) -> np.ndarray:
    """fp16 crops [n, C, h, w] as float32 [n, h, w, C], in memory."""
    return np.ascontiguousarray(np.moveaxis(features, 1, -1), np.float32)


def _augmented_view(
    dataset: LabelledDataset,
    config: TrainConfig,
    scale: float,
    mirrored: bool,
    span: tuple[int, int],
    model_path: Path | None,
    progress: bool,
) -> AugmentedView:
    width, height = config.input_size
    size = round_input_size((width * scale, height * scale))
    request = FeatureRequest(config.tap_name, config.roi, mirrored)
    features = cached_features(dataset, [request], size, span, model_path, progress=progress)[request]
    mask = config.roi.cell_mask(*tap_shape(config.tap_name, size, model_path)[1:])
    return AugmentedView(size, channels_last(features), mask)


def make_optimizer(
    name: str, params: Iterable[torch.nn.Parameter], lr: float, steps: int, curricula: tuple[Curriculum, ...] = ()
) -> torch.optim.Optimizer:
    """The named optimizer, its stages sized for a budget of `steps` steps and to start after the curricula end."""
    return OPTIMIZERS.lookup(name).make(params, lr, steps, max((c.settled_step for c in curricula), default=1))


class BalancedSampler:
    """Endless batches of frame indices, half positive and half negative, drawn with replacement."""

    def __init__(self, frames: np.ndarray, targets: np.ndarray, batch_size: int, seed: int):
        self.positives = frames[targets == 1]
        self.negatives = frames[targets == 0]
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        n_pos = self.batch_size // 2
        n_neg = self.batch_size - n_pos
        targets = np.concatenate([np.ones(n_pos, np.float32), np.zeros(n_neg, np.float32)])
        while True:
            frames = np.concatenate([self.rng.choice(self.positives, n_pos), self.rng.choice(self.negatives, n_neg)])
            yield frames, targets


class Logits(nn.Module):
    """An MC whose forward is its training logits, so that DDP (which hooks forward) can wrap it."""

    def __init__(self, model: MicroClassifier):
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.logits(features, valid)


def train_steps(
    net: nn.Module,
    data: TrainingData,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    config: TrainConfig,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> list[float]:
    """`config.steps` optimizer steps of binary cross-entropy on `net(features, valid)` logits against targets
    moved `config.label_smoothing` towards 0.5, with the config's curricula; the loss of each step.
    `on_step(step)` runs after each step (the net is back in training mode after it)."""
    steps, device, curricula, label_smoothing = config.steps, config.device, config.curricula, config.label_smoothing
    # Which view each step trains on: the input size itself or one of the scaled ones, uniformly.
    views = np.random.default_rng(config.seed).integers(0, len(data.views) + 1, steps)
    net.to(device).train()
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses: list[float] = []
    with progress_bar(progress, total=steps, desc="training MC", unit="step") as bar:
        for step, (frames, targets) in zip(range(1, steps + 1), batches, strict=False):
            check_stop()
            inputs = data.inputs(frames, device, int(views[step - 1]))
            features, valid, difficulties = curriculum_inputs(*inputs, curricula, step)
            smoothed = targets * (1.0 - 2.0 * label_smoothing) + label_smoothing
            loss = loss_fn(net(features, valid), torch.from_numpy(smoothed).to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(step)
                net.train()
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.3f}", **difficulties, refresh=False)
    return losses


def curriculum_inputs(
    features: torch.Tensor, valid: torch.Tensor | None, curricula: tuple[Curriculum, ...], step: int
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, int]]:
    """The inputs of step `step` (from 1) made as easy as the curricula say, and the difficulty of each kind."""
    difficulties = {}
    for curriculum in curricula:
        difficulty = difficulties[curriculum.kind] = curriculum.scheduler.difficulty(step)
        if curriculum.kind == "window":
            assert valid is not None  # check_curricula allows window curricula on windowed MCs only
            window = valid.shape[1]
            valid = valid & (torch.arange(window, device=valid.device) >= window - difficulty)
        else:
            features = coarsen(features, difficulty)
    return features, valid, difficulties


def coarsen(features: torch.Tensor, percent: int) -> torch.Tensor:
    """Features [..., C, h, w] average-pooled to `percent` of their cells per side (rounded up), then repeated
    back to h x w: a coarser view of the same crop, in the shape the MC was built for."""
    height, width = features.shape[-2:]
    grid = (-(-height * percent // FULL_RESOLUTION), -(-width * percent // FULL_RESOLUTION))
    if grid == (height, width):
        return features
    maps = features.flatten(0, -4)  # windows [B, W, C, h, w] -> [B*W, C, h, w]; crops stay as they are
    coarse = F.interpolate(F.adaptive_avg_pool2d(maps, grid), size=(height, width), mode="nearest")
    return coarse.view_as(features)


def predict(
    model: MicroClassifier, data: TrainingData, frames: np.ndarray, batch_size: int = 128, device: str = "cpu"
) -> np.ndarray:
    """Scores (probabilities) of the given frames, as the edge would compute them."""
    model.to(device).eval()
    scores = []
    with torch.no_grad():
        for chunk in np.array_split(frames, max(1, -(-len(frames) // batch_size))):
            features, valid = data.inputs(chunk, device)
            scores.append(torch.sigmoid(model.logits(features, valid)).cpu().numpy())
    return np.concatenate(scores)


def make_spec(
    config: TrainConfig,
    smoothing: Smoothing,
    validation: Validation | None = None,
    base_model: BaseModelId | None = None,
    warnings: tuple[str, ...] = (),
    motion: MotionVeto | None = None,
    trained_on: TrainedOn | None = None,
) -> FilterSpec:
    try:
        return FilterSpec(
            name=config.name or default_name(config.event, config.architecture),
            event=config.event,
            architecture=config.architecture,
            tap=config.tap_name,
            roi=config.roi,
            input_size=config.input_size,
            smoothing=smoothing,
            window=config.window,
            validation=validation,
            base_model=base_model,
            warnings=warnings,
            motion=motion,
            trained_on=trained_on,
        )
    except ValidationError as exc:
        raise FilterForwardError(f"the filter spec would not be valid: {validation_summary(exc, 'spec')}") from None


def default_name(event: str, architecture: str) -> str:
    """'<event>-<architecture>' made into a valid filter name."""
    name = re.sub(r"[^a-z0-9_.-]+", "-", f"{event}-{architecture}".lower()).strip("-_.")[:64]
    if not re.match(NAME_PATTERN, name):
        raise FilterForwardError(f"cannot make a filter name from event {event!r}: give one with --name")
    return name


def finish_bundle(
    model: MicroClassifier,
    spec: FilterSpec,
    crop_chw: tuple[int, int, int],
    tap_shape: tuple[int, int, int],
    out_dir: Path,
) -> Path:
    """Export to ONNX, check it against torch and against the spec as the edge will, write the bundle."""
    model = model.cpu().eval()
    onnx_bytes = export_mc(model, crop_chw)
    verify_export(model, onnx_bytes, crop_chw)
    check_mc_model(spec, onnx_bytes, tap_shape)
    return write_bundle(out_dir, spec, onnx_bytes)


def _tap_shape(config: TrainConfig, model_path: Path | None) -> tuple[int, int, int]:
    """Full (uncropped) shape of the MC's tap at the training input size."""
    return tap_shape(config.tap_name, tuple(config.input_size), model_path)


@cache
def tap_shape(tap: str, input_size: tuple[int, int], model_path: Path | None) -> tuple[int, int, int]:
    if tap == PIXELS:
        return PIXEL_TAP.shape(input_size)
    from models.basednn import BaseDNN

    return BaseDNN(input_size, model_path).taps[tap].shape(input_size)
