"""The kinds of microclassifier, by name: what the filter spec, training, export, the bundle check and the CLI
need to know of each.

No torch here: the edge and the cloud validate specs and check MC models without it, so a kind names its
nn.Module (a models.microclassifiers.MicroClassifier) by import path, imported only when an MC is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from models.registry import Registry
from models.roi import MAX_CONTEXT
from models.taps import PIXELS


@dataclass(frozen=True)
class MCKind:
    name: str
    model: str  # "package.module:Class" of its MicroClassifier; Class.for_crop builds one
    default_tap: str  # the tap it reads when training is given none
    # Decides on the last W frames: trained on windows, and on the edge its ONNX model takes a `history`
    # input and returns this frame's `reduced` features for the next frames.
    windowed: bool = False
    # One classifier per cell of its crop, whatever the crop's size: it can train on other input sizes too.
    cellwise: bool = False

    @property
    def reads_pixels(self) -> bool:
        """A baseline on the resized frame itself (the `pixels` tap), which reads no base-DNN tap at all."""
        return self.default_tap == PIXELS


# What an edge runs its MCs' fully connected layers in (edge.mcfusion): as trained, or int8 weights.
MCWeights = Literal["fp32", "int8"]

AUTO = "auto"  # in place of a kind: the one cross-validation chooses (models.model_selection)
# The default filter reads cells around the event's region, and its full-frame MCs compare a cell with its
# neighbours as far (models.microclassifiers.FullFrame): one cell per this input size's scale, at least one, so that
# the neighbourhood grows with the objects, which span more cells at larger input sizes. One cell at 384x224 and
# 320x256, two at 768x448 and 640x480: decided on the region cases of bench/tap_rule.py (bench README, the peak
# neighbourhood).
AUTO_CONTEXT_SCALE = (384, 224)


def auto_context(input_size: tuple[int, int]) -> int:
    """Context cells of the default filter at a base-DNN input size (width, height)."""
    scale = math.sqrt(input_size[0] * input_size[1] / (AUTO_CONTEXT_SCALE[0] * AUTO_CONTEXT_SCALE[1]))
    return min(MAX_CONTEXT, max(1, round(scale)))


MC_KINDS: Registry[MCKind] = Registry(
    "MC architecture",
    [
        MCKind("full_frame", "models.microclassifiers:FullFrame", "late", cellwise=True),
        MCKind("localized", "models.microclassifiers:Localized", "mid"),
        MCKind("windowed", "models.microclassifiers:Windowed", "mid", windowed=True),
        MCKind("discrete", "models.microclassifiers:Discrete", PIXELS),
    ],
)
