"""The motion-detector baseline of bench/generalization.py: what DVR-Scan would do with the event's region.

OpenCV's MOG2 background subtractor runs over every frame of the clip in order (as it would on the
camera); a frame's score is the fraction of foreground pixels inside the event's region (its polygon, else
its box). The threshold and the k-of-n smoothing are chosen on the training frames only, by the same event
F1 the MCs are scored with; the test frames are then scored once.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from models.datasets import LabelledDataset
from models.evaluation import event_f1
from models.roi import ROI
from models.smoother import smooth_scores

# MOG2 runs on frames scaled to this width: motion detection does not need more (DVR-Scan downscales too).
WORK_WIDTH = 480
SMOOTHINGS = ((1, 1), (2, 3), (3, 5), (4, 7))
THRESHOLD_QUANTILES = np.linspace(0.02, 0.98, 49)


@dataclass(frozen=True)
class MotionRule:
    threshold: float  # foreground fraction in the region
    k: int
    n: int


def region_mask(roi: ROI, width: int, height: int) -> np.ndarray:
    """Bool image mask of the region at this size (pixel centres inside the polygon or box)."""
    xs = (np.arange(width) + 0.5) / width
    ys = (np.arange(height) + 0.5) / height
    return roi.contains(xs[None, :], ys[:, None])


def foreground_fractions(dataset: LabelledDataset, roi: ROI) -> np.ndarray:
    """MOG2 foreground fraction inside the region, for every frame of the clip in order."""
    width, height = dataset.frame_size
    size = (WORK_WIDTH, max(1, round(height * WORK_WIDTH / width)))
    mask = region_mask(roi, *size)
    subtractor = cv2.createBackgroundSubtractorMOG2(detectShadows=False)
    opening = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
    fractions = np.zeros(dataset.n_frames)
    for index, frame in dataset.frames():
        small = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
        foreground = cv2.morphologyEx(subtractor.apply(small), cv2.MORPH_OPEN, opening) > 0
        fractions[index] = foreground[mask].mean()
    return fractions


def fit_rule(fractions: np.ndarray, labels: np.ndarray, tolerance: int) -> MotionRule:
    """The threshold (a quantile of the training fractions) and k-of-n with the best training event F1."""
    best: tuple[float, MotionRule] | None = None
    candidates = np.unique(np.quantile(fractions, THRESHOLD_QUANTILES))
    for k, n in SMOOTHINGS:
        for threshold in candidates[(candidates > 0) & (candidates < 1)]:
            f1 = event_f1(labels, smooth_scores(fractions, float(threshold), k, n), tolerance).f1
            if best is None or f1 > best[0]:
                best = (f1, MotionRule(float(threshold), k, n))
    if best is None:  # no foreground at all in the training frames: a rule that never fires
        return MotionRule(1.0 - 1e-9, 1, 1)
    return best[1]


def apply_rule(rule: MotionRule, fractions: np.ndarray) -> np.ndarray:
    return smooth_scores(fractions, rule.threshold, rule.k, rule.n)
