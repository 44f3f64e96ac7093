"""Pixel motion inside a filter's region: OpenCV's MOG2 background subtractor, the DVR-Scan way.

The default filter uses it as a veto: a frame counts towards the filter's k-of-n only if some of the region's
pixels moved in the last few frames, at least half as many as moved on nearly every frame that showed the event in
training (`fit_veto`). People who stand behind a shop window the whole time, which the base DNN's features cannot
tell from people walking in the region, do not move; an event whose training frames show it without motion gets
no veto (its fitted floor is 0). Training (models.training) and the edge (edge.pipeline) use this one module, so the
fractions a filter was fitted on are the ones it is judged by; training counts only frames a model had watched long
enough, one camera frame after the other, as a camera's has (`region_foreground`).
"""

from __future__ import annotations

import math
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
# ... halved: that share is what the smallest thing doing the event in training moved, and the event done later by
# something smaller (a person farther from the camera) moves fewer pixels. At the whole share, adl's right fifth,
# trained on people close to the camera, held back every later occurrence (bench/veto_floor.py, bench README).
FLOOR_SCALE = 0.5
RECENT_FRAMES = 5  # a frame passes the veto when one of the last this many frames had the floor's motion
# MOG2's history (its default): the frames it takes to settle. A replay of a clip's later part, and the training
# frames of a later span, first show it up to this many frames before (as a live camera's model has seen them):
# a fresh model calls noise motion for a few dozen frames.
HISTORY = 500
# Frames a fresh model must watch before its fractions are the ones of a model that has watched for long: whatever
# moves in its first frames is taken for background at first. On the benchmark's clips a fresh model started at
# frames 100-300 agreed with one that had watched from the clip's start (within 0.005 of the region) after 0-48
# frames, where it did within 70 (bench/veto_fit.py).
SETTLE_FRAMES = 50
OPENING_REACH = 2  # pixels: a 3x3 erosion, then a 3x3 dilation


def work_size(frame_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) MOG2 sees for frames of this (width, height)."""
    width, height = frame_size
    return WORK_WIDTH, max(1, round(height * WORK_WIDTH / width))


def region_mask(roi: ROI, width: int, height: int) -> np.ndarray:
    """Bool image mask of the region at this size (pixel centres inside the polygon or box; context ignored)."""
    xs = (np.arange(width) + 0.5) / width
    ys = (np.arange(height) + 0.5) / height
    return roi.contains(xs[None, :], ys[:, None])


def modelled_box(rois: Iterable[ROI], size: tuple[int, int]) -> tuple[slice, slice]:
    """The rows and columns (at work size `size`) that give the regions' pixels the fractions a model of the whole
    frame would: MOG2 models each pixel alone, and the 3x3 opening reaches 2 pixels, hence the margin."""
    width, height = size
    masks = [region_mask(roi, width, height) for roi in rois]
    ys, xs = np.logical_or.reduce(masks).nonzero() if masks else ((), ())
    if not len(xs):
        return slice(0, height), slice(0, width)
    reach = OPENING_REACH
    rows = slice(max(0, int(ys.min()) - reach), min(height, int(ys.max()) + 1 + reach))
    return rows, slice(max(0, int(xs.min()) - reach), min(width, int(xs.max()) + 1 + reach))


def source_span(span: slice, source: int, work: int) -> tuple[slice, slice]:
    """`span` of a work-size axis widened to the pixels whose INTER_AREA resize does not depend on the pixels
    around them, and the source pixels that resize to it: the resize of that part of the frame equals that part
    of the whole frame's resize (the scale repeats every source / gcd source pixels)."""
    period = work // math.gcd(source, work)
    start, stop = span.start // period * period, min(work, -(-span.stop // period) * period)
    return slice(start, stop), slice(start * source // work, stop * source // work)


class ForegroundMeter:
    """One camera's background model of the part of its frames that its filters' regions cover (all of it without
    regions): feed it every frame in order; it says which pixels moved."""

    def __init__(self, rois: Iterable[ROI] = ()) -> None:
        self.rois = frozenset(rois)
        self._opening = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
        self._masks: dict[tuple[ROI, tuple[int, int]], np.ndarray] = {}
        # Set by the first frame (_start): its size, the work size, and the rows and columns modelled at the work
        # size and in the frame.
        self._frame_size: tuple[int, int] | None = None
        self._work_shape = (0, 0)
        self._box = self._source = (slice(0), slice(0))
        self._subtractor = cv2.createBackgroundSubtractorMOG2(history=HISTORY, detectShadows=False)
        self.watched = 0  # frames the current model has seen

    @property
    def settled(self) -> bool:
        """Whether the last frame came after SETTLE_FRAMES others: before, its fractions are not yet the ones of a
        model that has watched for long (a fresh camera, a new region, a new resolution)."""
        return self.watched > SETTLE_FRAMES

    def foreground(self, image: np.ndarray) -> np.ndarray:
        """The moving pixels of this frame (bool, at the work size; none outside the regions' box); updates the
        background model."""
        height, width = image.shape[:2]
        if (width, height) != self._frame_size:  # a camera that changed resolution starts over
            self._start(width, height)
        rows, columns = self._box
        small = cv2.resize(image[self._source], (columns.stop - columns.start, rows.stop - rows.start),
                           interpolation=cv2.INTER_AREA)  # fmt: skip
        moving = np.zeros(self._work_shape, bool)
        moving[self._box] = cv2.morphologyEx(self._subtractor.apply(small), cv2.MORPH_OPEN, self._opening) > 0
        self.watched += 1
        return moving

    def _start(self, width: int, height: int) -> None:
        """A fresh background model of the regions' box in frames of this size."""
        self._frame_size = width, height
        work_width, work_height = work_size((width, height))
        self._work_shape = work_height, work_width
        rows, columns = modelled_box(self.rois, (work_width, work_height))
        (rows, source_rows), (columns, source_columns) = (
            source_span(rows, height, work_height),
            source_span(columns, width, work_width),
        )
        self._box, self._source = (rows, columns), (source_rows, source_columns)
        self._subtractor = cv2.createBackgroundSubtractorMOG2(history=HISTORY, detectShadows=False)
        self.watched = 0

    def fraction(self, foreground: np.ndarray, roi: ROI) -> float:
        """The share of the region's pixels that moved."""
        key = (roi, foreground.shape)  # per frame and filter: no copy of the ROI (its context does not matter here)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = region_mask(roi, foreground.shape[1], foreground.shape[0])
        return float(foreground[mask].mean()) if mask.any() else 0.0


def foreground_fractions(frames: Iterable[tuple[int, np.ndarray]], roi: ROI) -> np.ndarray:
    """The region's foreground fraction of every frame, in the order given (the model learns as it goes)."""
    meter = ForegroundMeter([roi])
    return np.array([meter.fraction(meter.foreground(image), roi) for _, image in frames])


def region_foreground(dataset: LabelledDataset, roi: ROI, span: tuple[int, int]) -> np.ndarray:
    """The region's foreground fraction of every frame of the span as a camera's background model sees it, NaN where
    that cannot be told: where the model had watched fewer than SETTLE_FRAMES consecutive camera frames (the start of
    a recording, and after every gap of a dataset sampled apart or joined from several times:
    LabelledDataset.consecutive), whereas a camera's has watched for long. Each run of consecutive frames gets a
    model of its own, warmed up on up to HISTORY of its frames before the span. The last few are kept, as the
    default filter's candidates ask for the same ones."""
    first = max(0, span[0] - HISTORY)
    follows = dataset.consecutive(first, span[1])
    key = (str(dataset.source), dataset.n_frames, roi.with_context(0), span, follows.tobytes())
    if key not in _FRACTIONS:
        while len(_FRACTIONS) >= _KEPT:
            _FRACTIONS.pop(next(iter(_FRACTIONS)))
        _FRACTIONS[key] = _settled_fractions(dataset.frames(first, span[1]), follows, roi)[span[0] - first :]
    return _FRACTIONS[key]


def _settled_fractions(frames: Iterable[tuple[int, np.ndarray]], follows: np.ndarray, roi: ROI) -> np.ndarray:
    """The region's fraction of every frame, a fresh model after each frame that does not follow the one before;
    NaN on a model's first SETTLE_FRAMES frames."""
    fractions = np.full(len(follows), np.nan)
    meter = ForegroundMeter([roi])
    for position, ((_, image), follow) in enumerate(zip(frames, follows, strict=True)):
        if not follow and meter.watched:
            meter = ForegroundMeter([roi])
        fraction = meter.fraction(meter.foreground(image), roi)
        if meter.settled:
            fractions[position] = fraction
    return fractions


_KEPT = 4
_FRACTIONS: dict[tuple[str, int, ROI, tuple[int, int], bytes], np.ndarray] = {}


def fit_veto(fractions: np.ndarray, labels: np.ndarray) -> MotionVeto | None:
    """The veto for frames with these fractions and 0/1/-1 labels; None when the event shows without motion
    (the floor would be 0) or not at all."""
    fractions = np.asarray(fractions)
    positive = fractions[(np.asarray(labels) == 1) & np.isfinite(fractions)]
    if not positive.size:
        return None
    floor = FLOOR_SCALE * float(np.quantile(positive, POSITIVE_QUANTILE))
    return MotionVeto(min_foreground=round(floor, 6), frames=RECENT_FRAMES) if floor > 0 else None


def no_veto_reason(fractions: np.ndarray, labels: np.ndarray) -> str:
    """Why `fit_veto` gave these frames no veto, and what would give one: for the training summary."""
    fractions, labels = np.asarray(fractions), np.asarray(labels)
    if not (labels == 1).any():
        return "no training frame shows the event"
    if not np.isfinite(fractions[labels == 1]).any():
        return (
            f"no frame with the event comes after {SETTLE_FRAMES} consecutive camera frames (footage sampled apart, "
            f"or the event only in a recording's first {SETTLE_FRAMES} frames), so its motion on the camera is "
            f"unknown: for a veto, label the event on footage of every frame, past the footage's first {SETTLE_FRAMES}"
        )
    return "the event shows without motion in the region on some of its training frames (people standing in it)"


def still(fractions: np.ndarray, veto: MotionVeto | None) -> np.ndarray:
    """Per frame of consecutive `fractions`: whether the veto holds it back (none of its last `veto.frames` frames
    reached the floor), as the edge decides it frame by frame. A frame whose last frames include one of unknown
    fraction (NaN) is not held back."""
    fractions = np.asarray(fractions, dtype=float)
    if veto is None:
        return np.zeros(fractions.size, bool)
    padded = np.concatenate([np.zeros(veto.frames - 1), fractions])
    return np.lib.stride_tricks.sliding_window_view(padded, veto.frames).max(axis=1) < veto.min_foreground
