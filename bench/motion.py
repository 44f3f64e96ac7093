"""The motion-detector baseline of bench/generalization.py: what DVR-Scan would do with the event's region.

OpenCV's MOG2 background subtractor runs over every frame of the clip in order (as it would on the
camera); a frame's score is the fraction of foreground pixels inside the event's region (its polygon, else
its box): models.motion.foreground_fractions, the same the default filter's motion veto uses. The threshold
and the k-of-n smoothing are chosen on the training frames only, by the same event F1 the MCs are scored with;
the test frames are then scored once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.evaluation import event_f1
from models.smoother import smooth_scores

SMOOTHINGS = ((1, 1), (2, 3), (3, 5), (4, 7))
THRESHOLD_QUANTILES = np.linspace(0.02, 0.98, 49)


@dataclass(frozen=True)
class MotionRule:
    threshold: float  # foreground fraction in the region
    k: int
    n: int


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
