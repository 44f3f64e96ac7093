"""Regions of interest in normalised image coordinates, mapped onto feature-map cells."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ROI(BaseModel):
    """An axis-aligned box in normalised image coordinates (0..1, origin top-left)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    x0: float = Field(0.0, ge=0.0, le=1.0)
    y0: float = Field(0.0, ge=0.0, le=1.0)
    x1: float = Field(1.0, ge=0.0, le=1.0)
    y1: float = Field(1.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> ROI:
        if self.x1 <= self.x0 or self.y1 <= self.y0:
            raise ValueError(f"ROI needs x0 < x1 and y0 < y1, got ({self.x0}, {self.y0}, {self.x1}, {self.y1})")
        return self

    def cells(self, height: int, width: int) -> tuple[slice, slice]:
        """Row and column slices of a (height x width) grid covered by this ROI (at least one cell)."""
        return _span(self.y0, self.y1, height), _span(self.x0, self.x1, width)

    def cell_shape(self, height: int, width: int) -> tuple[int, int]:
        rows, cols = self.cells(height, width)
        return rows.stop - rows.start, cols.stop - cols.start


FULL_FRAME = ROI()


def _span(lo: float, hi: float, n: int) -> slice:
    start = min(math.floor(lo * n + 1e-9), n - 1)
    stop = max(math.ceil(hi * n - 1e-9), start + 1)
    return slice(start, min(stop, n))
