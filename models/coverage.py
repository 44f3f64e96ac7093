"""Where in its region a full-frame MC saw the event during training.

A full-frame MC scores every cell of its region and takes the best one, so it can recognise the event
anywhere in the region, but only if the training frames show it at more than one place: an event seen at
one spot only (a car always parked in the same bay) teaches the MC what that spot looks like with the event,
not the event. The winning cell of each positive training frame shows where the MC found it.
"""

from __future__ import annotations

import numpy as np
import torch

from models.microclassifiers import FullFrame, MicroClassifier
from models.roi import ROI

# A region this many cells across (both ways) or more can show the event at separate places.
MIN_REGION_CELLS = 4
# The middle 80% of the winning cells span at most this fraction of the region's rows and of its columns:
# one place.
ONE_PLACE = 0.25


def one_place_warning(
    model: MicroClassifier, positives: torch.Tensor, roi: ROI, mask: np.ndarray, tap_hw: tuple[int, int]
) -> str | None:
    """A warning when the MC found the event in one small part of its region on every positive frame.

    `positives`: the positive training frames' crops [B, C, h, w]; `mask`: the region's cells [h, w] of the crop;
    `tap_hw`: the whole tap's cells (the crop is `roi.cells` of it, context included)."""
    if model.architecture != FullFrame.architecture or not len(positives):
        return None
    rows, cols = np.nonzero(mask)
    region_rows, region_cols = np.ptp(rows) + 1, np.ptp(cols) + 1
    if min(region_rows, region_cols) < MIN_REGION_CELLS:
        return None
    width = mask.shape[1]
    with torch.no_grad():
        winners = model.eval().cell_logits(positives).argmax(dim=1).cpu().numpy()
    row, col = np.divmod(winners, width)
    row_spread, col_spread = _spread(row) / region_rows, _spread(col) / region_cols
    if max(row_spread, col_spread) > ONE_PLACE:
        return None
    crop_rows, crop_cols = roi.cells(*tap_hw)
    x = (crop_cols.start + np.median(col) + 0.5) / tap_hw[1]
    y = (crop_rows.start + np.median(row) + 0.5) / tap_hw[0]
    return (
        f"every training frame shows the event at one place in the region (around x={x:.2f}, y={y:.2f} of the "
        "frame): the filter may only know it there; label occurrences at other places in the region"
    )


def _spread(cells: np.ndarray) -> float:
    """Cells spanned by the middle 80% of the values (robust to a few stray winners)."""
    low, high = np.percentile(cells, [10, 90])
    return float(high - low + 1)
