"""The optimizers training offers by name (`--optimizer`), each set up for the short runs an MC trains for.

No torch here, so that the CLI lists them without importing it: an entry names its torch.optim.Optimizer by
import path, imported when one is made. The compressed optimizers are in models.optimizers.

Their stage lengths (full-precision warm-up, variance freezing, local-step growth) are fractions of the step
budget, because their defaults are sized for runs of 100k steps and an MC trains for hundreds. The warm-up
starts when the curricula reach full difficulty: entries that easier inputs leave without gradient (the masked
frames of a window) would otherwise keep a near-zero frozen variance and blow up when the harder inputs reach
them (measured: loss 4e9 by step 10).
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.registry import Registry

if TYPE_CHECKING:
    import torch

WARMUP_FRACTION = 0.2  # 1-bit Adam/LAMB: full-precision steps before the variance freezes (paper: 15-25%)
VARIANCE_FRACTION = 0.5  # 0/1 Adam: steps with (sparse) variance refreshes before local steps begin
SYNC_LEVEL_FRACTION = 0.05  # 0/1 Adam: synchronisations per interval level of the local steps
# LAMB's lr is a step relative to each tensor's norm (trust ratio ‖p‖/‖u‖), Adam's an absolute one per entry.
# MC weights have an RMS of 0.03-0.1, so an Adam lr is matched by a LAMB lr about 10x larger (measured on the
# intel-car full-frame MC, 5 seeds: at 1x 1-bit LAMB had barely fitted when its variance froze and ended 3
# F1 points below Adam; at 10x it was never more than 0.3 below; at 20x it was worse again).
LAMB_LR_SCALE = 10.0

# (step budget, first step at full difficulty) -> the optimizer's keyword arguments for its stage lengths.
Stages = Callable[[int, int], dict[str, int]]


def _steps(budget: int, fraction: float, settled: int = 1) -> int:
    """A fraction of the budget (at least one step), counted from the first step at full difficulty."""
    return settled - 1 + max(1, round(budget * fraction))


def _no_stages(steps: int, settled: int) -> dict[str, int]:
    return {}


def _warmup(steps: int, settled: int) -> dict[str, int]:
    """1-bit Adam/LAMB: full precision until the variance freezes."""
    return {"freeze_step": _steps(steps, WARMUP_FRACTION, settled)}


def _variance_then_local_steps(steps: int, settled: int) -> dict[str, int]:
    """0/1 Adam: variance refreshes until it freezes, then local steps between ever rarer synchronisations."""
    return {
        "var_freeze_step": _steps(steps, VARIANCE_FRACTION, settled),
        "local_step_scaler": _steps(steps, SYNC_LEVEL_FRACTION),
    }


@dataclass(frozen=True)
class OptimizerKind:
    name: str
    optimizer: str  # "package.module:Class" of its torch.optim.Optimizer
    # It communicates its own (compressed) gradients between ranks, so distributed training does not wrap
    # the model in DDP, which would average them uncompressed first.
    compressed: bool = False
    stages: Stages = _no_stages
    lr_scale: float = 1.0  # the learning rate it gets, as a multiple of the configured one

    def make(
        self, params: Iterable[torch.nn.Parameter], lr: float, steps: int, settled: int = 1
    ) -> torch.optim.Optimizer:
        """One for these parameters, its stages sized for `steps` steps and starting at step `settled`."""
        optimizer = pkgutil.resolve_name(self.optimizer)
        return optimizer(params, lr=lr * self.lr_scale, **self.stages(steps, settled))


OPTIMIZERS: Registry[OptimizerKind] = Registry(
    "optimizer",
    [
        OptimizerKind("adam", "torch.optim:Adam"),
        OptimizerKind("onebit_adam", "models.optimizers:OnebitAdam", compressed=True, stages=_warmup),
        OptimizerKind(
            "zeroone_adam", "models.optimizers:ZeroOneAdam", compressed=True, stages=_variance_then_local_steps
        ),
        OptimizerKind(
            "onebit_lamb", "models.optimizers:OnebitLamb", compressed=True, stages=_warmup, lr_scale=LAMB_LR_SCALE
        ),
    ],
)
