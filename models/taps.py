"""The named taps of a base DNN: which feature maps an MC can read, and their geometry.

A base model is an ONNX graph with one input ``image`` (uint8, N x H x W x 3, BGR, H and W multiples
of the model's stride) and one float output per tap (N x C x H/stride x W/stride).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

IMAGE_INPUT = "image"
# Pixel "tap" read by the discrete (NoScope-style) baseline: the resized frame itself.
PIXELS = "pixels"


@dataclass(frozen=True)
class Tap:
    name: str
    channels: int
    stride: int

    def shape(self, input_size: tuple[int, int]) -> tuple[int, int, int]:
        """(C, H, W) of this tap for an input of (width, height)."""
        width, height = input_size
        return self.channels, height // self.stride, width // self.stride


# EfficientNet-Lite0: early = end of stage 2, mid = end of stage 5, late = end of stage 7.
EFFICIENTNET_LITE0_TAPS: dict[str, Tap] = {
    "early": Tap("early", 24, 4),
    "mid": Tap("mid", 112, 16),
    "late": Tap("late", 320, 32),
}
PIXEL_TAP = Tap(PIXELS, 3, 1)
MODEL_STRIDE = 32


MAX_INPUT_SIDE = 8192  # pixels: an 8K frame's width; also the bound of the wire format and the training API


def check_input_size(input_size: tuple[int, int], stride: int = MODEL_STRIDE) -> tuple[int, int]:
    width, height = input_size
    if max(width, height) > MAX_INPUT_SIDE:  # the base DNN's activations would not fit in memory
        raise ValueError(f"input size {width}x{height} is not valid: each side must be at most {MAX_INPUT_SIDE}")
    if width <= 0 or height <= 0 or width % stride or height % stride:
        near_width, near_height = round_input_size((max(width, 1), max(height, 1)), stride)
        raise ValueError(
            f"input size {width}x{height} is not valid: width and height must be positive multiples of "
            f"{stride} (e.g. {near_width}x{near_height})"
        )
    return width, height


# The input size a filter gets when none is given: its camera's frame, scaled down (aspect kept) to at most this
# many pixels. The base DNN's cost grows with the pixels, and a 1080p frame at full size cannot be run in real time
# on a small edge box (README, bench/cameras.py); a 16:9 camera of any resolution gets 768x448, the edge's default.
DEFAULT_INPUT_PIXELS = 768 * 448


def round_input_size(size: tuple[float, float], stride: int = MODEL_STRIDE) -> tuple[int, int]:
    """Nearest valid input size (multiples of the model stride) to a frame size."""
    width, height = size
    return max(stride, round(width / stride) * stride), max(stride, round(height / stride) * stride)


def default_input_size(frame_size: tuple[int, int], pixels: int = DEFAULT_INPUT_PIXELS) -> tuple[int, int]:
    """The base-DNN input size for filters of a camera with this frame size when none is given: the frame size,
    scaled down to at most `pixels` pixels (aspect kept), rounded to valid sizes."""
    width, height = frame_size
    scale = min(1.0, math.sqrt(pixels / max(1, width * height)))
    return round_input_size((width * scale, height * scale))
