"""Regions of interest in normalised image coordinates (0..1, origin top-left), mapped onto feature-map cells.

A region is a box or a polygon. An MC reads the tap cells under the region's bounding box (the crop); with a
polygon, only the cells at least half inside it count (the mask), so "inside the region" is given to
the MC rather than learned from where the training examples happened to be. A region with `context` cells
widens the crop by that many cells on every side (within the frame); those cells are read but never counted,
so a full-frame MC can tell an object inside the region from one beside it (models/microclassifiers.py).
"""

from __future__ import annotations

import math
import re

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, ValidationInfo, model_validator

from models.errors import FilterForwardError

Point = tuple[float, float]
POLYGON_HINT = "write at least 3 points 'x,y x,y x,y' in normalised 0..1 coordinates, e.g. '0,0.5 1,0.5 1,1 0,1'"
REGION_HINT = f"give a box x0,y0,x1,y1 in 0..1 (e.g. 0.5,0,1,1) or a polygon: {POLYGON_HINT}"
MAX_POLYGON_POINTS = 64
# Sample points per cell side when deciding which cells a polygon covers.
_SAMPLES = 4
# Cells of context around a region, at most: a full-frame MC compares a cell with its neighbours as far as its
# context reaches (models.microclassifiers.FullFrame), and the default filter's context grows with the tap's width
# (models.mc_kinds.auto_context): 4 from 1344x784 up.
MAX_CONTEXT = 4
# Validation context of regions a person gives (the CLI, dataset.yaml, REST): a polygon that crosses itself is
# refused there. Stored filter specs and bundles are read without it, so one made before that check still loads.
INPUT = {"input": True}


MIN_AREA = 1e-4  # of the frame: a region drawn by hand that is smaller is a slip of the mouse (below one tap cell)


def polygon_errors(points: tuple[Point, ...], given: bool = True) -> str | None:
    """Why these points are no usable polygon, or None; `given` (a region a person gives, not one stored before these
    checks): also when two of its edges cross, or it is a sliver."""
    if len(points) < 3:
        return f"a polygon needs at least 3 points, got {len(points)}"
    if len(points) > MAX_POLYGON_POINTS:
        return f"a polygon has at most {MAX_POLYGON_POINTS} points, got {len(points)}"
    array = np.asarray(points, dtype=float)
    if not np.isfinite(array).all() or array.min() < 0.0 or array.max() > 1.0:
        return "polygon points must be in normalised coordinates 0..1"
    if given and _crosses_itself(array):
        return "the polygon crosses itself: list its points in order around the region"
    area = abs(_area(array))
    if area < 1e-9:
        return "the polygon has no area"
    if given and area < MIN_AREA:
        return (
            f"the polygon covers {area:.1e} of the frame, less than {MIN_AREA:g}: a sliver; draw it around the area "
            "where the event happens"
        )
    return None


def _crosses_itself(points: np.ndarray) -> bool:
    """Whether two edges that share no corner cross: points listed out of order (a box given corner to opposite
    corner) would make a bow tie, whose two halves count as inside by the even-odd rule."""
    starts, ends = points, np.roll(points, -1, axis=0)
    first, second = np.triu_indices(len(points), k=2)
    apart = ~((first == 0) & (second == len(points) - 1))  # the last edge ends where the first starts
    first, second = first[apart], second[apart]
    a, b, c, d = starts[first], ends[first], starts[second], ends[second]
    straddles_second = _side(c, d, a) * _side(c, d, b) < -1e-12
    straddles_first = _side(a, b, c) * _side(a, b, d) < -1e-12
    return bool(np.any(straddles_second & straddles_first))


def _side(a: np.ndarray, b: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per row, the sign of which side of the line a->b the point p lies on (cross product)."""
    return (b[:, 0] - a[:, 0]) * (p[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (p[:, 0] - a[:, 0])


def contains(points: tuple[Point, ...], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Which points (normalised x, y arrays) lie inside the polygon (even-odd rule)."""
    array = np.asarray(points, dtype=float)
    xi, yi = array[:, 0], array[:, 1]
    xj, yj = np.roll(xi, 1), np.roll(yi, 1)
    px = np.asarray(x, dtype=float)[..., None]
    py = np.asarray(y, dtype=float)[..., None]
    crosses = (yi > py) != (yj > py)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = (xj - xi) * (py - yi) / (yj - yi) + xi
    return np.count_nonzero(crosses & (px < x_cross), axis=-1) % 2 == 1


def _area(points: np.ndarray) -> float:
    x, y = points[:, 0], points[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))


class ROI(BaseModel):
    """A box in normalised image coordinates, optionally with a polygon inside it (the box is its bounding box).

    Give either the box (x0, y0, x1, y1) or the polygon alone; the box of a polygon is filled in.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    x0: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    y0: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    x1: float = Field(1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    y1: float = Field(1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    polygon: tuple[Point, ...] | None = Field(
        None, description="points (x, y) in 0..1; only the cells whose centres lie inside count"
    )
    context: int = Field(
        0, ge=0, le=MAX_CONTEXT, description="cells around the region its MC reads (within the frame), never counted"
    )

    @model_validator(mode="before")
    @classmethod
    def _box_of_polygon(cls, data: object, info: ValidationInfo) -> object:
        if isinstance(data, dict) and data.get("polygon") is not None:
            try:
                points = tuple((float(x), float(y)) for x, y in data["polygon"])
            except (TypeError, ValueError):
                return data  # the field's own validation says what is wrong
            if reason := polygon_errors(points, given=bool(info.context and info.context.get("input"))):
                raise ValueError(reason)
            xs, ys = zip(*points, strict=True)
            box = {"x0": min(xs), "y0": min(ys), "x1": max(xs), "y1": max(ys)}
            given = {key: data[key] for key in box if key in data}
            if any(not math.isclose(float(value), box[key], abs_tol=1e-6) for key, value in given.items()):
                raise ValueError("a polygon's box is its bounding box: give the polygon alone")
            return {**data, **box}
        return data

    @model_validator(mode="after")
    def _valid(self) -> ROI:
        if self.x1 <= self.x0 or self.y1 <= self.y0:
            raise ValueError(f"ROI needs x0 < x1 and y0 < y1, got ({self.x0}, {self.y0}, {self.x1}, {self.y1})")
        return self

    def with_context(self, cells: int) -> ROI:
        """This region with `cells` cells of context (0..MAX_CONTEXT)."""
        if not 0 <= cells <= MAX_CONTEXT:
            raise FilterForwardError(f"a region's context is 0 to {MAX_CONTEXT} cells, got {cells}")
        return self.model_copy(update={"context": cells})

    def cells(self, height: int, width: int) -> tuple[slice, slice]:
        """Row and column slices of a (height x width) grid covered by this ROI's box (at least one cell) and its
        context cells: the crop an MC reads."""
        rows, cols = self._box_cells(height, width)
        return _widen(rows, self.context, height), _widen(cols, self.context, width)

    def _box_cells(self, height: int, width: int) -> tuple[slice, slice]:
        return _span(self.y0, self.y1, height), _span(self.x0, self.x1, width)

    def cell_shape(self, height: int, width: int) -> tuple[int, int]:
        rows, cols = self.cells(height, width)
        return rows.stop - rows.start, cols.stop - cols.start

    def cell_mask(self, height: int, width: int) -> np.ndarray:
        """Bool mask over the crop's cells (shape `cell_shape`): the cells this region covers.

        A box covers its whole crop but the context cells. A polygon covers the cells at least half inside it
        (sampled on a 4x4 grid per cell); a polygon too thin for that covers the cells it overlaps most.
        """
        rows, cols = self.cells(height, width)
        if self.polygon is None:
            mask = np.zeros((rows.stop - rows.start, cols.stop - cols.start), dtype=bool)
            box_rows, box_cols = self._box_cells(height, width)
            mask[
                box_rows.start - rows.start : box_rows.stop - rows.start,
                box_cols.start - cols.start : box_cols.stop - cols.start,
            ] = True
            return mask
        offsets = (np.arange(_SAMPLES) + 0.5) / _SAMPLES
        ys = ((np.arange(rows.start, rows.stop)[:, None] + offsets) / height).ravel()
        xs = ((np.arange(cols.start, cols.stop)[:, None] + offsets) / width).ravel()
        inside = contains(self.polygon, xs[None, :], ys[:, None])
        coverage = inside.reshape(len(ys) // _SAMPLES, _SAMPLES, len(xs) // _SAMPLES, _SAMPLES).mean(axis=(1, 3))
        mask = coverage >= 0.5
        return mask if mask.any() else coverage == coverage.max()

    def contains(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Which normalised points lie in the region (the polygon, else the box)."""
        if self.polygon is not None:
            return contains(self.polygon, x, y)
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        return (x >= self.x0) & (x < self.x1) & (y >= self.y0) & (y < self.y1)

    def describe(self) -> str:
        """One line for people: the polygon's points, or the box."""
        if self.polygon is not None:
            region = "polygon " + " ".join(f"{x:g},{y:g}" for x, y in self.polygon)
        elif self.with_context(0) == FULL_FRAME:
            return "full frame"
        else:
            region = f"box {self.x0:g},{self.y0:g},{self.x1:g},{self.y1:g}"
        return region + (f" (+{self.context} cell{'s' * (self.context > 1)} of context)" if self.context else "")


FULL_FRAME = ROI()


class Polygon(RootModel[tuple[Point, ...]]):
    """A polygon in normalised image coordinates (0..1, origin top-left), as a list of (x, y) points."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="after")
    def _valid(self) -> Polygon:
        if reason := polygon_errors(self.root):
            raise ValueError(reason)
        return self

    @classmethod
    def parse(cls, text: str) -> Polygon:
        """Parse 'x,y x,y x,y ...' (points split by spaces or ';'), e.g. '0,0.5 1,0.5 1,1 0,1'."""
        try:
            return cls.model_validate(_points(text))
        except (ValueError, ValidationError) as exc:
            raise FilterForwardError(f"polygon {text!r} does not parse ({_reason(exc)}): {POLYGON_HINT}") from None

    def contains(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Which points (normalised x, y arrays) lie inside (even-odd rule; the bottom/right edges are outside)."""
        return contains(self.root, x, y)

    def bbox(self) -> ROI:
        points = np.asarray(self.root, dtype=float)
        (x0, y0), (x1, y1) = points.min(axis=0), points.max(axis=0)
        return ROI(x0=x0, y0=y0, x1=x1, y1=y1)

    def roi(self) -> ROI:
        """This polygon as an MC's region: its bounding box as the crop, itself as the mask."""
        return ROI(polygon=self.root)


def parse_region(text: str) -> ROI:
    """A region from the command line: 'x0,y0,x1,y1' (a box) or 'x,y x,y x,y ...' (a polygon)."""
    text = text.strip()
    try:
        if re.fullmatch(r"[^\s;]*", text) and text.count(",") == 3:
            x0, y0, x1, y1 = (float(part) for part in text.split(","))
            return ROI(x0=x0, y0=y0, x1=x1, y1=y1)
        return ROI.model_validate({"polygon": _points(text)}, context=INPUT)
    except (ValueError, ValidationError) as exc:
        raise FilterForwardError(f"region {text!r} is not valid ({_reason(exc)}): {REGION_HINT}") from None


def _points(text: str) -> list[tuple[float, ...]]:
    points = [tuple(float(v) for v in pair.split(",")) for pair in re.split(r"[\s;]+", text.strip().strip(";"))]
    if odd := next((point for point in points if len(point) != 2), None):
        raise ValueError(f"a point of {len(odd)} numbers, not x,y")
    return points


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return exc.errors()[0]["msg"].removeprefix("Value error, ")
    return str(exc) if "not x,y" in str(exc) else "not numbers 'x,y'"


def _widen(span: slice, by: int, n: int) -> slice:
    return slice(max(0, span.start - by), min(n, span.stop + by))


def _span(lo: float, hi: float, n: int) -> slice:
    start = min(math.floor(lo * n + 1e-9), n - 1)
    stop = max(math.ceil(hi * n - 1e-9), start + 1)
    return slice(start, min(stop, n))
