"""The FilterForward paper's accuracy and bandwidth metrics: event F1 and bits per second of video.

Definitions (Canel et al., SysML 2019), with the choices the paper leaves open made explicit:

* Labels are per frame: 1 event, 0 no event, -1 uncertain. Uncertain frames are dropped before
  anything is counted, as in the paper; so `1 -1 1` is one event and `1 -1 0` ends the event at the 1.
* A ground-truth event is a maximal run of 1s in the label sequence with the uncertain frames removed
  (only 0s split events).
* precision = TP / (TP + FP) over the scored frames (1.0 when nothing is predicted positive).
* Per event: existence = 1 if any of its frames is predicted positive, overlap = the fraction of its
  scored frames predicted positive (its existence when boundary tolerance leaves no scored frame).
  event recall = 0.9 x mean existence + 0.1 x mean overlap (1.0 when there are no events).
* F1 = harmonic mean of precision and event recall.
* Boundary tolerance t: at each 0<->1 transition (a clip edge is no transition), the t frames on each
  side of it (any uncertain frames between count as the transition) are not scored: they are left out
  of precision, frame recall and the overlap denominators, not out of existence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.errors import FilterForwardError

EXISTENCE_WEIGHT = 0.9
# Frames ignored on each side of a label boundary when scoring a filter (`filterforward eval`, cross-validation):
# hand-set boundaries are good to about this much (see the car clip's SOURCE.md).
BOUNDARY_TOLERANCE = 2


@dataclass(frozen=True)
class EventScores:
    """Event F1 and the numbers it is made of; frame counts are over scored frames only."""

    precision: float
    event_recall: float
    f1: float
    existence: float
    overlap: float
    frame_recall: float
    tp: int
    fp: int
    fn: int
    n_events: int
    n_detected: int


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The maximal runs of True in a 1-D bool array as inclusive (start, end) index pairs."""
    mask = np.asarray(mask, dtype=bool)
    edges = np.diff(np.concatenate(([False], mask, [False])).astype(np.int8))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def event_f1(labels: np.ndarray, predicted: np.ndarray, tolerance: int = 0) -> EventScores:
    """Score per-frame predictions (bool or 0/1) against per-frame labels (1/0/-1) by the paper's event F1."""
    labels, predicted = _checked(labels, predicted, tolerance)
    certain = np.flatnonzero(labels != -1)  # original index of every certain frame
    truth, pred = labels[certain] == 1, predicted[certain]
    scored = ~_near_transitions(truth, certain, tolerance)[certain]
    events = runs(truth)

    tp = int(np.count_nonzero(truth & pred & scored))
    fp = int(np.count_nonzero(~truth & pred & scored))
    fn = int(np.count_nonzero(truth & ~pred & scored))
    existence = np.array([pred[a : b + 1].any() for a, b in events], dtype=float)
    overlap = np.array(
        [_overlap(pred[a : b + 1], scored[a : b + 1], hit) for (a, b), hit in zip(events, existence, strict=True)]
    )

    precision = tp / (tp + fp) if tp + fp else 1.0
    mean_existence = float(existence.mean()) if events else 1.0
    mean_overlap = float(overlap.mean()) if events else 1.0
    recall = EXISTENCE_WEIGHT * mean_existence + (1.0 - EXISTENCE_WEIGHT) * mean_overlap
    return EventScores(
        precision=precision,
        event_recall=recall,
        f1=_harmonic(precision, recall),
        existence=mean_existence,
        overlap=mean_overlap,
        frame_recall=tp / (tp + fn) if tp + fn else 1.0,
        tp=tp,
        fp=fp,
        fn=fn,
        n_events=len(events),
        n_detected=int(existence.sum()),
    )


def bandwidth_bps(total_bytes: int, n_frames: int, fps: float) -> float:
    """Bits per second of video: everything sent over the whole video's duration (n_frames / fps)."""
    if n_frames <= 0 or not fps > 0:
        raise FilterForwardError(f"bandwidth needs n_frames > 0 and fps > 0, got n_frames={n_frames}, fps={fps}")
    if total_bytes < 0:
        raise FilterForwardError(f"bandwidth needs total_bytes >= 0, got {total_bytes}")
    return total_bytes * 8 / (n_frames / fps)


def _checked(labels: np.ndarray, predicted: np.ndarray, tolerance: int) -> tuple[np.ndarray, np.ndarray]:
    labels, predicted = np.asarray(labels), np.asarray(predicted)
    if labels.ndim != 1 or labels.shape != predicted.shape:
        raise FilterForwardError(
            f"labels and predictions must be 1-D arrays of one length, got {labels.shape} and {predicted.shape}"
        )
    if not np.isin(labels, (-1, 0, 1)).all():
        raise FilterForwardError("labels must be 1 (event), 0 (no event) or -1 (uncertain): fix the label file")
    if not np.isin(predicted, (0, 1)).all():
        raise FilterForwardError("predictions must be bool or 0/1 per frame: threshold the scores first")
    check_tolerance(tolerance)
    return labels.astype(np.int8), predicted.astype(bool)


def check_tolerance(tolerance: int) -> None:
    if tolerance < 0:
        raise FilterForwardError(f"boundary tolerance must be >= 0 frames, got {tolerance}")


def scored_frames(labels: np.ndarray, tolerance: int) -> int:
    """How many frames event_f1 scores frame by frame: the certain ones farther than `tolerance` from a transition."""
    certain = np.flatnonzero(np.asarray(labels) != -1)
    truth = np.asarray(labels)[certain] == 1
    return int(np.count_nonzero(~_near_transitions(truth, certain, tolerance)[certain]))


def _near_transitions(truth: np.ndarray, certain: np.ndarray, tolerance: int) -> np.ndarray:
    """Mask over original frames: within `tolerance` frames of a 0<->1 transition between certain frames."""
    length = int(certain[-1]) + 1 if certain.size else 0
    near = np.zeros(length, dtype=bool)
    if tolerance == 0:
        return near
    for i in np.flatnonzero(truth[1:] != truth[:-1]).tolist():
        # The transition lies between certain frames certain[i] and certain[i + 1].
        near[max(0, certain[i] - tolerance + 1) : certain[i + 1] + tolerance] = True
    return near


def _overlap(pred: np.ndarray, scored: np.ndarray, existence: float) -> float:
    total = np.count_nonzero(scored)
    return np.count_nonzero(pred & scored) / total if total else existence


def _harmonic(a: float, b: float) -> float:
    return 2 * a * b / (a + b) if a + b else 0.0
