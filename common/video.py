"""Frame geometry the edge's encoders and the cloud's clips share."""

from __future__ import annotations


def even(size: int) -> int:
    """A frame side as H.264 in yuv420p takes it: an odd side grows by one pixel (chroma covers 2x2 pixels),
    never shrinks, so no pixel of the camera's frame is cut off. One rule for the edge and the cloud."""
    if size < 1:
        raise ValueError(f"a frame side must be at least 1 pixel, got {size}")
    return size + size % 2
