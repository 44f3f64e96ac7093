"""The change gate on real frames of the parking-lot clip: the empty lot is skipped, a car entering is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.change_gate import ChangeGate, union_mask
from models.datasets import open_dataset
from models.roi import FULL_FRAME, ROI, parse_region


@pytest.fixture(scope="module")
def lot(intel_car: Path) -> dict[int, np.ndarray]:
    """Frames of the empty lot (20-27) and of the white car entering (50-57; the first pass starts at 54)."""
    dataset = open_dataset(intel_car)
    frames = dict(dataset.frames(20, 28))
    frames.update(dataset.frames(50, 58))
    return frames


def test_the_empty_lot_reuses_the_first_frames_scores_and_a_car_entering_is_processed(
    lot: dict[int, np.ndarray],
) -> None:
    gate = ChangeGate(pixel_delta=12, changed_fraction=0.002, max_skipped=100)
    empty = [gate.must_process(lot[i], [FULL_FRAME]) for i in range(20, 28)]
    assert empty[0] and not any(empty[1:])  # the first frame is the reference; the still lot matches it
    entering = [gate.must_process(lot[i], [FULL_FRAME]) for i in range(50, 58)]
    assert entering[0]  # 23 frames later, cars on their way in: processed
    assert any(entering[1:])  # and the car keeps moving
    assert gate.counters.processed == 1 + sum(entering)
    assert gate.counters.skipped == 16 - gate.counters.processed


def test_a_change_outside_every_region_is_skipped_and_inside_it_is_not(lot: dict[int, np.ndarray]) -> None:
    still = lot[20]
    changed = still.copy()
    height, width = still.shape[:2]
    changed[: height // 4, : width // 4] = 255 - changed[: height // 4, : width // 4]  # top-left corner flips
    bottom_right = ROI(x0=0.5, y0=0.5, x1=1.0, y1=1.0)
    gate = ChangeGate(pixel_delta=12, changed_fraction=0.002, max_skipped=100)
    assert gate.must_process(still, [bottom_right])
    assert not gate.must_process(changed, [bottom_right])
    top_left = ROI(x0=0.0, y0=0.0, x1=0.5, y1=0.5)
    assert gate.must_process(changed, [top_left])  # new regions: processed whatever the pixels
    assert not gate.must_process(changed, [top_left])
    assert gate.must_process(still, [top_left])  # the corner flips back inside the region


def test_at_most_max_skipped_frames_in_a_row_are_skipped(lot: dict[int, np.ndarray]) -> None:
    gate = ChangeGate(pixel_delta=12, changed_fraction=0.002, max_skipped=2)
    decisions = [gate.must_process(lot[20], [FULL_FRAME]) for _ in range(7)]
    assert decisions == [True, False, False, True, False, False, True]


def test_reset_processes_the_next_frame(lot: dict[int, np.ndarray]) -> None:
    gate = ChangeGate(pixel_delta=12, changed_fraction=0.002, max_skipped=100)
    assert gate.must_process(lot[20], [FULL_FRAME])
    gate.reset()
    assert gate.must_process(lot[20], [FULL_FRAME])


def test_the_union_of_a_polygon_and_a_box() -> None:
    triangle = parse_region("0,0 1,0 0,1")
    corner = ROI(x0=0.75, y0=0.75, x1=1.0, y1=1.0)
    mask = union_mask([triangle, corner], 8, 8)
    assert mask[0, 0] and mask[0, 6] and mask[6, 0]  # above the diagonal ...
    assert mask[7, 7] and mask[6, 6]  # ... except the box
    assert not mask[5, 5]
