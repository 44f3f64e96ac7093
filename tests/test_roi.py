"""Regions: boxes and polygons in normalised coordinates, their crops and their masks over tap cells."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from models.errors import FilterForwardError
from models.filterspec import FilterSpec
from models.roi import FULL_FRAME, INPUT, ROI, Polygon, parse_region

TRAPEZOID = ((0.0, 0.45), (0.2, 0.45), (0.3, 1.0), (0.0, 1.0))


def test_a_polygon_brings_its_bounding_box() -> None:
    roi = ROI(polygon=TRAPEZOID)
    assert (roi.x0, roi.y0, roi.x1, roi.y1) == (0.0, 0.45, 0.3, 1.0)
    assert ROI.model_validate_json(roi.model_dump_json()) == roi
    assert ROI(x0=0, y0=0.45, x1=0.3, y1=1, polygon=TRAPEZOID) == roi  # a box that agrees is accepted
    with pytest.raises(ValidationError, match="bounding box: give the polygon alone"):
        ROI(x0=0.1, y0=0.45, x1=0.3, y1=1, polygon=TRAPEZOID)


@pytest.mark.parametrize(
    ("points", "reason"),
    [
        (((0, 0), (1, 1)), "at least 3 points"),
        (((0, 0), (1.5, 0), (1, 1)), "normalised coordinates"),
        (((0, 0), (0.5, 0.5), (1, 1)), "no area"),
        # Three clicks nearly in a line (area 2e-5): saved as a region no tap cell fits in.
        (((0.2, 0.2), (0.6, 0.6), (0.4, 0.4001)), r"covers 2\.0e-05 of the frame, less than 0\.0001: a sliver"),
        (((0, 0), (1, 1), (1, 0), (0, 1)), "crosses itself"),  # a box's corners given diagonally
        (((0.1, 0.1), (0.6, 0.9), (0.6, 0.1), (0.1, 0.7)), "crosses itself"),  # a bow tie with area
        (tuple((i / 100, (i % 2) / 2) for i in range(65)), "at most 64 points"),
    ],
)
def test_bad_polygons_are_refused(points: tuple, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        ROI.model_validate({"polygon": points}, context=INPUT)


def test_a_stored_polygon_that_crosses_itself_still_loads() -> None:
    # A filter spec registered before crossing polygons were refused: the cloud and the edges still read it.
    bow_tie = ((0.1, 0.1), (0.6, 0.9), (0.6, 0.1), (0.1, 0.7))
    assert ROI.model_validate_json(ROI(polygon=bow_tie).model_dump_json()).polygon == bow_tie


def test_a_box_masks_its_whole_crop() -> None:
    roi = ROI(x0=0.5, y0=0, x1=1, y1=0.5)
    assert roi.cell_shape(8, 10) == (4, 5)
    assert roi.cell_mask(8, 10).all()


def test_context_widens_the_crop_within_the_frame_and_never_counts() -> None:
    box = ROI(x0=0.5, y0=0, x1=0.75, y1=0.5, context=1)  # cells 2:4 of 8 rows, 5:8 of 10 columns
    assert box.cells(8, 10) == (slice(0, 5), slice(4, 9))  # clipped at the top edge
    mask = box.cell_mask(8, 10)
    assert mask.shape == (5, 5)
    assert mask[:4, 1:4].all() and mask.sum() == 12  # the box's own cells, not the context around them
    strip = ROI(polygon=((0, 0), (0.3, 0), (0.3, 1), (0, 1)), context=1)
    assert strip.cells(4, 10) == (slice(0, 4), slice(0, 4))
    assert strip.cell_mask(4, 10).tolist() == [[True, True, True, False]] * 4
    assert ROI(context=1).cells(4, 10) == (slice(0, 4), slice(0, 10))
    assert strip.describe().endswith("(+1 cell of context)")
    assert ROI(context=1).describe() == "full frame"
    assert ROI(x0=0.5, y0=0, x1=0.75, y1=0.5, context=2).cells(8, 10) == (slice(0, 6), slice(3, 10))
    with pytest.raises(ValidationError, match="less than or equal to 4"):
        ROI(context=5)


def test_a_polygon_masks_the_cells_more_than_half_inside() -> None:
    triangle = ROI(polygon=((0, 0), (1, 1), (0, 1)))  # below the diagonal of a 4x4 grid
    mask = triangle.cell_mask(4, 4)
    # Cells on the diagonal are exactly half inside: 6 of their 16 sample points lie strictly inside, so they stay out.
    assert mask.tolist() == [
        [False, False, False, False],
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
    ]


def test_a_polygon_thinner_than_a_cell_keeps_the_cells_it_overlaps_most() -> None:
    sliver = ROI(polygon=((0.0, 0.5), (1.0, 0.5), (1.0, 0.52), (0.0, 0.52)))
    mask = sliver.cell_mask(4, 8)
    assert mask.shape == sliver.cell_shape(4, 8) == (1, 8)
    assert mask.all()


def test_regions_contain_points() -> None:
    points_x, points_y = np.array([0.05, 0.25, 0.29, 0.5]), np.array([0.5, 0.5, 0.99, 0.9])
    assert ROI(polygon=TRAPEZOID).contains(points_x, points_y).tolist() == [True, False, True, False]
    assert ROI(x0=0, y0=0.45, x1=0.3, y1=1).contains(points_x, points_y).tolist() == [True, True, True, False]


def test_parse_region_takes_a_box_or_a_polygon() -> None:
    assert parse_region("0.5,0,1,1") == ROI(x0=0.5, y0=0, x1=1, y1=1)
    assert parse_region("0,0.45 0.2,0.45 0.3,1 0,1") == ROI(polygon=TRAPEZOID)
    assert parse_region("0,0.45;0.2,0.45;0.3,1;0,1") == ROI(polygon=TRAPEZOID)
    assert Polygon.parse("0,0.45 0.2,0.45 0.3,1 0,1").roi() == ROI(polygon=TRAPEZOID)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0.5,0,0.2,1", "ROI needs x0 < x1"),
        ("0,0 1,1", "at least 3 points"),
        ("a,b c,d e,f", "not numbers"),
        ("0,0 2,0 2,2", "normalised coordinates"),
        ("0,0 1,1 1,0 0,1", "crosses itself"),
    ],
)
def test_bad_regions_are_one_line_with_the_syntax(text: str, reason: str) -> None:
    with pytest.raises(FilterForwardError, match=reason) as info:
        parse_region(text)
    message = str(info.value)
    assert "\n" not in message and "x0,y0,x1,y1" in message and "'x,y x,y x,y'" in message


def test_filter_specs_carry_polygons() -> None:
    spec = FilterSpec(name="f", architecture="full_frame", tap="late", roi=ROI(polygon=TRAPEZOID), input_size=(64, 64))
    again = FilterSpec.model_validate_json(spec.model_dump_json())
    assert again.roi.polygon == TRAPEZOID
    assert FilterSpec(name="g", architecture="full_frame", tap="late", input_size=(64, 64)).roi == FULL_FRAME
    assert FULL_FRAME.describe() == "full frame"
    assert ROI(polygon=TRAPEZOID).describe() == "polygon 0,0.45 0.2,0.45 0.3,1 0,1"


@pytest.mark.parametrize(
    "points",
    [
        ((0, 0), (1, 0), (1, 1), (0.5, 0.3), (0, 1)),  # concave
        ((0, 0), (0.33, 0), (0.33, 1), (0, 1), (0, 0)),  # closed by repeating the first point
        ((0, 0), (1, 0), (1, 0.5), (0.5, 0.5), (0.5, 1), (0, 1)),  # an L with a corner on no other edge
    ],
)
def test_simple_polygons_are_accepted(points: tuple) -> None:
    assert ROI(polygon=points).polygon == tuple(tuple(map(float, p)) for p in points)
