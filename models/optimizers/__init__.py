"""Communication-compressed distributed optimizers (1-bit Adam, 0/1 Adam, 1-bit LAMB) as torch.optim.Optimizers.

Each runs on one process (no process group needed) or under torch.distributed (gloo or NCCL), where it
does its own gradient communication; see docs/distributed-training.md for use with and without DDP.
Training offers them by name through models.optimizer_kinds.
"""

from models.optimizers.base import CompressedOptimizer
from models.optimizers.onebit_adam import OnebitAdam
from models.optimizers.onebit_lamb import OnebitLamb
from models.optimizers.zeroone_adam import ZeroOneAdam

__all__ = ["CompressedOptimizer", "OnebitAdam", "OnebitLamb", "ZeroOneAdam"]
