"""The named taps of a base DNN: which feature maps an MC can read, and their geometry.

A base model is an ONNX graph with one input ``image`` (uint8, N x H x W x 3, BGR, H and W multiples
of the model's stride) and one float output per tap (N x C x H/stride x W/stride).
"""

from __future__ import annotations

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


def check_input_size(input_size: tuple[int, int], stride: int = MODEL_STRIDE) -> tuple[int, int]:
    width, height = input_size
    if width <= 0 or height <= 0 or width % stride or height % stride:
        raise ValueError(
            f"input size {width}x{height} is not valid: width and height must be positive multiples of "
            f"{stride} (e.g. {round_input_size((max(width, 1), max(height, 1)), stride)})"
        )
    return width, height


def round_input_size(size: tuple[int, int], stride: int = MODEL_STRIDE) -> tuple[int, int]:
    """Nearest valid input size (multiples of the model stride) to a frame size."""
    width, height = size
    return max(stride, round(width / stride) * stride), max(stride, round(height / stride) * stride)
