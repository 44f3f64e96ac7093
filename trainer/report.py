"""A training job's report: the cross-validated estimate, the warnings, example frames (hits, false alarms, misses)
and the unlabelled frames the trained filter is least sure of."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from models.crossval import CrossValidation
    from models.datasets import LabelledDataset
    from models.model_selection import CandidateEstimate
    from models.training import TrainConfig, TrainingData, TrainResult


log = logging.getLogger(__name__)

EXAMPLES = 6  # example frames of each kind in a report
TO_LABEL = 20  # unlabelled frames a report proposes to label next


@dataclass
class Trained:
    """A trained filter and what its report is made of."""

    result: TrainResult
    config: TrainConfig  # the kind trained
    data: TrainingData
    validation: CrossValidation | None  # the chosen kind's cross-validation in this process, if it ran here
    candidates: list[CandidateEstimate]


# -- the report ------------------------------------------------------------------------------------------------


def make_report(trained: Trained, examples: dict[str, Any], uncertain: list[dict[str, Any]]) -> dict[str, Any]:
    """The report the cloud stores with the job (cloud.schemas.TrainingReport)."""
    result, spec = trained.result, trained.result.spec
    validation = spec.validation
    return {
        "filter": spec.name,
        "event": spec.event,
        "architecture": spec.architecture,
        "tap": spec.tap,
        "input_size": list(spec.input_size),
        "frames": list(trained.data.span),
        "positives": result.n_positive,
        "negatives": result.n_negative,
        "steps": len(result.losses),
        "validation": validation.model_dump(mode="json") if validation else None,
        "training_f1": round(float(result.train_scores.f1), 4),
        "warnings": [*spec.caveats, *([f"no motion veto: {result.no_veto}"] if result.no_veto else [])],
        "candidates": [
            {
                "architecture": c.architecture,
                "tap": c.tap,
                "validation": c.validation and c.validation.model_dump(mode="json"),
            }
            for c in trained.candidates
        ],
        "examples": examples,
        "uncertain": uncertain,
        "seconds": 0.0,
    }


def examples_of(trained: Trained, base_model: Path | None) -> dict[str, Any]:
    """Example frames from the out-of-fold scores of cross-validation where it ran here; else from the filter's
    own scores on its training frames (optimistic: it was fitted to them)."""
    data, smoothing = trained.data, trained.result.spec.smoothing
    labels = data.frame_labels()
    if trained.validation is not None:
        frames = np.sort(np.concatenate([fold.held_out for fold in trained.validation.plan.folds]))
        return example_frames(frames, trained.validation.scores[frames], labels, smoothing, "cross-validation")
    frames = np.arange(*data.span)
    scores = onnx_scores(_model(trained), data.features, data.first, frames, trained.config.context)
    return example_frames(frames, scores, labels, smoothing, "training frames")


def uncertain_frames(trained: Trained, dataset: LabelledDataset, base_model: Path | None) -> list[dict[str, Any]]:
    """The unlabelled frames the filter is least sure about: scored by it (on every frame's features, computed before
    training), the TO_LABEL closest to its threshold, closest first."""
    from models.datasets.labelled import UNCERTAIN
    from models.features import FeatureRequest, cached_features

    config = trained.config
    frames = np.flatnonzero(dataset.labels[config.event] == UNCERTAIN)  # no label, or labelled uncertain
    if not frames.size:
        return []
    request = FeatureRequest(config.tap_name, config.roi)
    features = cached_features(dataset, [request], config.input_size, None, base_model, progress=False)[request]
    scores = onnx_scores(_model(trained), features, 0, frames, config.context)
    closest = np.argsort(np.abs(scores - trained.result.spec.smoothing.threshold), kind="stable")[:TO_LABEL]
    return [{"frame": int(frames[i]), "score": round(float(np.clip(scores[i], 0.0, 1.0)), 4)} for i in closest]


def _model(trained: Trained) -> bytes:
    return (trained.result.bundle / "model.onnx").read_bytes()


def example_frames(frames: np.ndarray, scores: np.ndarray, labels: np.ndarray, smoothing: Any, source: str) -> dict:
    """Hits, false alarms and misses among `frames` (ascending; the smoother restarts where they skip), a few of
    each: the most telling frame of runs spread over the clip."""
    decided = _smoothed(frames, scores, smoothing)
    truth = labels[frames]
    kinds = {
        "hits": (decided & (truth == 1), -1),  # the most confident hit of each run
        "false_alarms": (decided & (truth == 0), -1),  # the most confident false alarm
        "misses": (~decided & (truth == 1), 1),  # the lowest-scored missed frame
    }
    examples: dict[str, Any] = {
        "source": source,
        "counts": {kind: int(mask.sum()) for kind, (mask, _) in kinds.items()},
    }
    for kind, (mask, sign) in kinds.items():
        examples[kind] = _telling(frames[mask], scores[mask], sign)
    return examples


def _smoothed(frames: np.ndarray, scores: np.ndarray, smoothing: Any) -> np.ndarray:
    from models.smoother import smooth_scores

    if not frames.size:
        return np.zeros(0, dtype=bool)
    breaks = np.flatnonzero(np.diff(frames) != 1) + 1
    pieces = np.split(np.arange(frames.size), breaks)
    return np.concatenate([smooth_scores(scores[p], smoothing.threshold, smoothing.k, smoothing.n) for p in pieces])


def _telling(frames: np.ndarray, scores: np.ndarray, sign: int) -> list[dict[str, Any]]:
    """One frame per run of consecutive frames (the highest score for sign -1, the lowest for 1), at most EXAMPLES
    runs spread evenly over the clip."""
    if not frames.size:
        return []
    runs = np.split(np.arange(frames.size), np.flatnonzero(np.diff(frames) != 1) + 1)
    chosen = [runs[i] for i in np.unique(np.linspace(0, len(runs) - 1, min(EXAMPLES, len(runs))).round().astype(int))]
    picks = [run[np.argmin(sign * scores[run])] for run in chosen]
    return [{"frame": int(frames[i]), "score": round(float(np.clip(scores[i], 0.0, 1.0)), 4)} for i in picks]


def onnx_scores(onnx_bytes: bytes, features: np.ndarray, first: int, frames: np.ndarray, context: int) -> np.ndarray:
    """The exported MC's scores on the given frames (ascending), from the features of frames `first`.., as the edge
    computes them (a windowed MC frame by frame with its history, from frame `first`)."""
    import onnxruntime as ort

    from models.bundle import FEATURES_INPUT, HISTORY_INPUT, REDUCED_OUTPUT, SCORE_OUTPUT

    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    if context == 1:
        rows = np.asarray(features[frames - first], dtype=np.float32)
        return np.concatenate(
            [
                session.run([SCORE_OUTPUT], {FEATURES_INPUT: chunk})[0]
                for chunk in np.array_split(rows, max(1, len(rows) // 128))
            ]
        )
    shape = next(i for i in session.get_inputs() if i.name == HISTORY_INPUT).shape
    history = np.zeros((1, shape[1], *features.shape[2:]), np.float32)
    scores = {}
    for frame in range(first, int(frames[-1]) + 1):
        crop = np.asarray(features[frame - first : frame - first + 1], dtype=np.float32)
        score, reduced = session.run([SCORE_OUTPUT, REDUCED_OUTPUT], {FEATURES_INPUT: crop, HISTORY_INPUT: history})
        history = np.concatenate([history[:, reduced.shape[1] :], reduced], axis=1)
        scores[frame] = float(score[0])
    return np.array([scores[int(f)] for f in frames])
