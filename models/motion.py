"""Pixel motion inside a filter's region: OpenCV's MOG2 background subtractor, the DVR-Scan way.

The default filter uses it as a veto: a frame counts towards the filter's k-of-n only if some of the region's
pixels moved in the last few frames, at least as many as moved on nearly every frame that showed the event in
training (`fit_veto`). People who stand behind a shop window the whole time, which the base DNN's features cannot
tell from people walking in the region, do not move; an event whose training frames show it without motion gets
no veto (its fitted floor is 0). Training (models.training) and the edge (edge.pipeline) use this one module, so the
fractions a filter was fitted on are the ones it is judged by.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import cv2
import numpy as np

from models.filterspec import MotionVeto
from models.roi import ROI

if TYPE_CHECKING:
    from models.datasets.labelled import LabelledDataset

# MOG2 runs on frames scaled to this width: motion detection does not need more (DVR-Scan downscales too).
WORK_WIDTH = 480
# The veto's floor: this quantile of the positive training frames' foreground fractions, so that the 2% of them
# with the least motion (an object pausing) do not set it (bench README, "motion veto").
POSITIVE_QUANTILE = 0.02
RECENT_FRAMES = 5  # a frame passes the veto when one of the last this many frames had the floor's motion
# MOG2's history (its default): the frames it takes to settle. A replay of a clip's later part, and the training
# frames of a later span, first show it up to this many frames before (as a live camera's model has seen them):
# a fresh model calls noise motion for a few dozen frames.
HISTORY = 500


def work_size(frame_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) MOG2 sees for frames of this (width, height)."""
    width, height = frame_size
    return WORK_WIDTH, max(1, round(height * WORK_WIDTH / width))


def region_mask(roi: ROI, width: int, height: int) -> np.ndarray:
    """Bool image mask of the region at this size (pixel centres inside the polygon or box; context ignored)."""
    xs = (np.arange(width) + 0.5) / width
    ys = (np.arange(height) + 0.5) / height
    return roi.contains(xs[None, :], ys[:, None])


class ForegroundMeter:
    """One camera's background model: feed it every frame in order; it says which pixels moved."""

    def __init__(self) -> None:
        self._subtractor = cv2.createBackgroundSubtractorMOG2(history=HISTORY, detectShadows=False)
        self._opening = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
        self._masks: dict[tuple[ROI, tuple[int, int]], np.ndarray] = {}

    def foreground(self, image: np.ndarray) -> np.ndarray:
        """The moving pixels of this frame (bool, at the work size); updates the background model."""
        small = cv2.resize(image, work_size((image.shape[1], image.shape[0])), interpolation=cv2.INTER_AREA)
        return cv2.morphologyEx(self._subtractor.apply(small), cv2.MORPH_OPEN, self._opening) > 0

    def fraction(self, foreground: np.ndarray, roi: ROI) -> float:
        """The share of the region's pixels that moved."""
        key = (roi, foreground.shape)  # per frame and filter: no copy of the ROI (its context does not matter here)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = region_mask(roi, foreground.shape[1], foreground.shape[0])
        return float(foreground[mask].mean()) if mask.any() else 0.0


def foreground_fractions(frames: Iterable[tuple[int, np.ndarray]], roi: ROI) -> np.ndarray:
    """The region's foreground fraction of every frame, in the order given (the model learns as it goes)."""
    meter = ForegroundMeter()
    return np.array([meter.fraction(meter.foreground(image), roi) for _, image in frames])


def region_foreground(dataset: LabelledDataset, roi: ROI, span: tuple[int, int]) -> np.ndarray:
    """The region's foreground fraction of every frame of the span (the model warmed up on the HISTORY frames
    before it); the last few are kept, as the default filter's candidates ask for the same ones."""
    key = (str(dataset.source), dataset.n_frames, roi.with_context(0), span)
    if key not in _FRACTIONS:
        while len(_FRACTIONS) >= _KEPT:
            _FRACTIONS.pop(next(iter(_FRACTIONS)))
        first = max(0, span[0] - HISTORY)
        _FRACTIONS[key] = foreground_fractions(dataset.frames(first, span[1]), roi)[span[0] - first :]
    return _FRACTIONS[key]


_KEPT = 4
_FRACTIONS: dict[tuple[str, int, ROI, tuple[int, int]], np.ndarray] = {}


def fit_veto(fractions: np.ndarray, labels: np.ndarray) -> MotionVeto | None:
    """The veto for frames with these fractions and 0/1/-1 labels; None when the event shows without motion
    (the floor would be 0) or not at all."""
    positive = np.asarray(fractions)[np.asarray(labels) == 1]
    if not positive.size:
        return None
    floor = float(np.quantile(positive, POSITIVE_QUANTILE))
    return MotionVeto(min_foreground=round(floor, 6), frames=RECENT_FRAMES) if floor > 0 else None


def still(fractions: np.ndarray, veto: MotionVeto | None) -> np.ndarray:
    """Per frame of consecutive `fractions`: whether the veto holds it back (none of its last `veto.frames` frames
    reached the floor), as the edge decides it frame by frame."""
    fractions = np.asarray(fractions, dtype=float)
    if veto is None:
        return np.zeros(fractions.size, bool)
    padded = np.concatenate([np.zeros(veto.frames - 1), fractions])
    return np.lib.stride_tricks.sliding_window_view(padded, veto.frames).max(axis=1) < veto.min_foreground
