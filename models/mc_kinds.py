"""The kinds of microclassifier, by name: what the filter spec, training, export, the bundle check and the CLI
need to know of each.

No torch here: the edge and the cloud validate specs and check MC models without it, so a kind names its
nn.Module (a models.microclassifiers.MicroClassifier) by import path, imported only when an MC is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from models.registry import Registry
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
# Cells of context around the event's region that the default filter reads (at least); decided on the region
# cases of bench/tap_rule.py (bench README).
AUTO_CONTEXT = 1
MC_KINDS: Registry[MCKind] = Registry(
    "MC architecture",
    [
        MCKind("full_frame", "models.microclassifiers:FullFrame", "late", cellwise=True),
        MCKind("localized", "models.microclassifiers:Localized", "mid"),
        MCKind("windowed", "models.microclassifiers:Windowed", "mid", windowed=True),
        MCKind("discrete", "models.microclassifiers:Discrete", PIXELS),
    ],
)
