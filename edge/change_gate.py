"""The change gate: a frame that barely differs from the last one the base DNN ran on reuses its MC scores.

Fixed cameras show the same scene most of the time; the difference detectors of NoScope and Reducto skip those
frames before the expensive network. Here a frame is compared, downscaled to gray, with the last *processed*
frame (not the previous one, so that a slow change adds up until it is seen) inside the union of the active
filters' regions: what happens outside every region cannot change a decision. The frame is skipped when fewer
than `changed_fraction` of the region's pixels moved by more than `pixel_delta` gray levels. At most
`max_skipped` frames in a row are skipped, so a change below the gate's resolution is still caught.

Windowed MCs see a skipped frame as a repeat of the last processed one (their history does not advance),
which is what it is, within the gate's tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from models.roi import ROI

# Width of the gray thumbnail the gate compares: fine enough for a person far from the camera to cover a few
# dozen pixels, small enough to cost well under a millisecond next to the base DNN's tens.
GATE_WIDTH = 256


@dataclass
class GateCounters:
    """Per camera: frames the gate let through to the base DNN and frames whose scores it reused."""

    processed: int = 0
    skipped: int = 0


class ChangeGate:
    """Decides per frame whether the base DNN must run (see the module docstring)."""

    def __init__(self, pixel_delta: int, changed_fraction: float, max_skipped: int):
        self.pixel_delta = pixel_delta
        self.changed_fraction = changed_fraction
        self.max_skipped = max_skipped
        self.counters = GateCounters()
        self._reference: np.ndarray | None = None  # thumbnail of the last processed frame
        self._regions: tuple[ROI, ...] = ()  # the regions the reference was taken for
        self._mask: np.ndarray | None = None  # their union on the thumbnail
        self._run = 0  # frames skipped in a row

    def must_process(self, image: np.ndarray, regions: Sequence[ROI]) -> bool:
        """True when the base DNN must run on this frame (the frame becomes the new reference); False when the
        last processed frame's scores stand for it. A change of the regions always processes."""
        thumbnail = gray_thumbnail(image)
        regions = tuple(regions)
        if self._skippable(thumbnail, regions):
            self._run += 1
            self.counters.skipped += 1
            return False
        if regions != self._regions or self._mask is None or self._mask.shape != thumbnail.shape:
            self._regions, self._mask = regions, union_mask(regions, *thumbnail.shape)
        self._reference, self._run = thumbnail, 0
        self.counters.processed += 1
        return True

    def reset(self) -> None:
        """Forget the reference (the next frame is processed): after a gap in the stream or new filters."""
        self._reference = None

    def _skippable(self, thumbnail: np.ndarray, regions: tuple[ROI, ...]) -> bool:
        reference, mask = self._reference, self._mask
        if reference is None or mask is None or regions != self._regions or reference.shape != thumbnail.shape:
            return False
        if self._run >= self.max_skipped:
            return False
        return changed_fraction(thumbnail, reference, mask, self.pixel_delta) < self.changed_fraction


def changed_fraction(thumbnail: np.ndarray, reference: np.ndarray, mask: np.ndarray, pixel_delta: int) -> float:
    """Fraction of the mask's pixels that moved by more than pixel_delta gray levels from the reference."""
    moved = cv2.absdiff(thumbnail, reference) > pixel_delta
    return float(np.count_nonzero(moved & mask)) / max(1, int(np.count_nonzero(mask)))


def gray_thumbnail(image: np.ndarray) -> np.ndarray:
    """The frame in gray at GATE_WIDTH pixels wide (area-averaged, which also evens out sensor noise)."""
    height, width = image.shape[:2]
    size = (min(GATE_WIDTH, width), max(1, round(height * min(GATE_WIDTH, width) / width)))
    small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(small, cv2.COLOR_BGR2GRAY) if small.ndim == 3 else small


def union_mask(regions: Sequence[ROI], height: int, width: int) -> np.ndarray:
    """Bool [height, width]: the pixels inside any region (a region's polygon where it has one, else its box)."""
    mask = np.zeros((height, width), dtype=bool)
    for roi in regions:
        rows, cols = roi.cells(height, width)
        mask[rows, cols] |= roi.cell_mask(height, width)
    return mask
