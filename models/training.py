"""Train one microclassifier for one event of a labelled dataset from cached features, and write its bundle.

The pieces are small on purpose so that distributed training can reuse them: `load_training_data` (the
cached crops and labels of a frame range), `BalancedSampler` (batches half positive, half negative),
`make_optimizer` (by name), `train_steps` (the loop), `predict` (scores over a range), `choose_threshold`
(on the training range only) and `finish_bundle` (export, check, write).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from pydantic import ValidationError
from tqdm import tqdm

from edge.smoother import smooth_scores
from models.bundle import check_mc_model, validation_summary, write_bundle
from models.datasets.labelled import UNCERTAIN, LabelledDataset
from models.errors import FilterForwardError
from models.evaluation import EventScores, event_f1
from models.features import FeatureRequest, cached_features
from models.filterspec import NAME_PATTERN, FilterSpec, Smoothing
from models.mc_export import export_mc, verify_export
from models.microclassifiers import ARCHITECTURES, MicroClassifier, build_mc
from models.roi import FULL_FRAME, ROI
from models.taps import PIXEL_TAP, PIXELS

log = logging.getLogger(__name__)

DEFAULT_TAPS = {"full_frame": "late", "localized": "mid", "windowed": "mid", "discrete": PIXELS}
# Candidate thresholds: a grid fine enough for event F1, never 0 or 1 (FilterSpec needs 0 < t < 1).
THRESHOLDS = np.round(np.arange(0.05, 0.96, 0.05), 2)

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter], float], torch.optim.Optimizer]
OPTIMIZERS: dict[str, OptimizerFactory] = {"adam": lambda params, lr: torch.optim.Adam(params, lr=lr)}


@dataclass(frozen=True)
class TrainConfig:
    """What to train: one MC architecture on one tap/ROI for one event, on a frame range."""

    event: str
    architecture: str
    input_size: tuple[int, int]
    tap: str | None = None  # default per architecture (DEFAULT_TAPS)
    roi: ROI = FULL_FRAME
    frames: tuple[int, int] | None = None  # training range, stop exclusive; None: every frame
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    window: int = 5
    optimizer: str = "adam"
    smoothing: Smoothing = field(default_factory=Smoothing)
    name: str | None = None  # filter name; default "<event>-<architecture>"
    device: str = "cpu"
    # MCs are tiny: one CPU thread is as fast as several and does not collapse when cores are shared.
    threads: int = 1

    @property
    def tap_name(self) -> str:
        return self.tap or DEFAULT_TAPS[self.architecture]

    @property
    def context(self) -> int:
        """Frames an MC sees per decision: W for a windowed MC, else 1."""
        return self.window if self.architecture == "windowed" else 1


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

    @property
    def crop_chw(self) -> tuple[int, int, int]:
        return tuple(self.features.shape[1:])

    def inputs(self, frames: np.ndarray, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
        """Model inputs for these frames: crops [B, C, h, w], or for windowed MCs windows [B, W, C, h, w]
        with a mask that is False for frames before frame 0 (the edge's zero history at stream start)."""
        if self.window == 1:
            return torch.from_numpy(self.features[frames - self.first]).to(device).float(), None
        offsets = frames[:, None] + np.arange(1 - self.window, 1)[None]
        valid = offsets >= 0
        rows = np.clip(offsets - self.first, 0, None)
        windows = torch.from_numpy(self.features[rows]).to(device).float()
        return windows, torch.from_numpy(valid).to(device)


@dataclass(frozen=True)
class TrainResult:
    spec: FilterSpec
    bundle: Path
    train_scores: EventScores  # event F1 on the training range at the chosen threshold
    losses: list[float]
    n_positive: int
    n_negative: int


def train_mc(
    dataset: LabelledDataset,
    config: TrainConfig,
    out_dir: Path,
    model_path: Path | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train, pick the threshold on the training range, export to ONNX and write the bundle to `out_dir`."""
    data = load_training_data(dataset, config, model_path, progress)
    torch.manual_seed(config.seed)
    model = build_mc(config.architecture, data.crop_chw[0], data.crop_chw[1:], config.window).to(config.device)
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    sampler = BalancedSampler(data.frames, data.targets, config.batch_size, config.seed)
    with torch_threads(config.threads):
        losses = train_steps(model, data, optimizer, sampler, config.steps, config.device, progress)
        scores = predict(model, data, np.arange(*data.span), device=config.device)
    threshold, train_scores = choose_threshold(scores, data.labels, config.smoothing)
    spec = make_spec(config, threshold)
    bundle = finish_bundle(model, spec, data.crop_chw, _tap_shape(config, model_path), out_dir)
    log.info("trained %s: train event F1 %.3f at threshold %.2f", spec.name, train_scores.f1, threshold)
    return TrainResult(spec, bundle, train_scores, losses, int(data.targets.sum()), int((data.targets == 0).sum()))


def check_config(dataset: LabelledDataset, config: TrainConfig) -> None:
    if config.architecture not in ARCHITECTURES:
        raise FilterForwardError(
            f"unknown MC architecture {config.architecture!r}: choose one of {', '.join(ARCHITECTURES)}"
        )
    if config.event not in dataset.labels:
        raise FilterForwardError(
            f"{dataset.name} has no event {config.event!r}; its events are {', '.join(dataset.events())}"
        )
    if config.optimizer not in OPTIMIZERS:
        raise FilterForwardError(f"unknown optimizer {config.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    if (config.tap_name == PIXELS) != (config.architecture == "discrete"):
        raise FilterForwardError(
            f"architecture {config.architecture} cannot read tap {config.tap_name!r}: only the discrete baseline "
            f"reads {PIXELS!r}, and it reads nothing else"
        )
    make_spec(config, 0.5)  # fails fast on a bad name or window, before any work
    if config.steps < 1 or config.batch_size < 2 or config.threads < 1:
        raise FilterForwardError(
            f"need steps >= 1, batch size >= 2 and threads >= 1, got {config.steps}, {config.batch_size} and "
            f"{config.threads}"
        )


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
    n_positive, n_negative = int(targets.sum()), int((targets == 0).sum())
    if n_positive == 0 or n_negative == 0:
        raise FilterForwardError(
            f"event {config.event!r} has {n_positive} positive and {n_negative} negative frames in frames "
            f"{start}:{stop} of {dataset.name}: pick a training range with both"
        )
    return TrainingData(features, first, (start, stop), labels, start + certain, targets, config.context)


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return OPTIMIZERS[name](params, lr)


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


def train_steps(
    model: MicroClassifier,
    data: TrainingData,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    steps: int,
    device: str = "cpu",
    progress: bool = True,
) -> list[float]:
    """`steps` optimizer steps of binary cross-entropy; the loss of each step."""
    model.to(device).train()
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses: list[float] = []
    with tqdm(total=steps, desc=f"training {model.architecture}", unit="step", disable=not progress) as bar:
        for _, (frames, targets) in zip(range(steps), batches, strict=False):
            features, valid = data.inputs(frames, device)
            loss = loss_fn(model.logits(features, valid), torch.from_numpy(targets).to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    return losses


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


def choose_threshold(scores: np.ndarray, labels: np.ndarray, smoothing: Smoothing) -> tuple[float, EventScores]:
    """The threshold with the best smoothed event F1 on these (training) frames; ties go nearest to 0.5."""
    best: tuple[float, float, EventScores] | None = None
    for threshold in sorted(THRESHOLDS.tolist(), key=lambda t: abs(t - 0.5)):
        predicted = smooth_scores(scores, threshold, smoothing.k, smoothing.n)
        result = event_f1(labels, predicted)
        if best is None or result.f1 > best[1]:
            best = (threshold, result.f1, result)
    return best[0], best[2]


def make_spec(config: TrainConfig, threshold: float) -> FilterSpec:
    try:
        return FilterSpec(
            name=config.name or default_name(config.event, config.architecture),
            event=config.event,
            architecture=config.architecture,
            tap=config.tap_name,
            roi=config.roi,
            input_size=config.input_size,
            smoothing=Smoothing(threshold=threshold, k=config.smoothing.k, n=config.smoothing.n),
            window=config.window,
        )
    except ValidationError as exc:
        raise FilterForwardError(f"the filter spec would not be valid: {validation_summary(exc)}") from None


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
    if config.tap_name == PIXELS:
        return PIXEL_TAP.shape(config.input_size)
    from edge.basednn import BaseDNN

    return BaseDNN(config.input_size, model_path).taps[config.tap_name].shape(config.input_size)
