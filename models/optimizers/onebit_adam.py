"""1-bit Adam (Tang et al. 2021): Adam whose momentum, once the variance is frozen, crosses the wire in 1 bit.

Warm-up (steps 1..freeze_step): Adam (torch's AdamW arithmetic: bias correction, decoupled weight
decay) on gradients averaged over ranks in full precision. Compression stage: the variance v stays
frozen; each rank folds its local gradient into the momentum, m ← β₁m + (1−β₁)g, the momenta of all
parameters, each divided by its frozen denominator √v̂+ε, are averaged in ONE error-compensated 1-bit
allreduce, and p ← p − lr·(m̂/(√v̂+ε) + wd·p). Compressing m/(√v̂+ε) rather than m is the paper's
algorithm with the compression error measured in Adam steps (see CompressedOptimizer._average_preconditioned):
it keeps entries with a tiny frozen variance from taking steps of ±scale/√v. Entries whose averaged
gradient was zero during the whole warm-up (v = 0) keep a zero momentum.
"""

from __future__ import annotations

import torch.distributed as dist

from models.optimizers.base import (
    Entry,
    FreezingOptimizer,
    Params,
    adam_denominator,
    adam_step,
    apply_direction,
    require_step_count,
    update_moments,
)


class OnebitAdam(FreezingOptimizer):
    """1-bit Adam as a torch.optim.Optimizer; works on one process as plain Adam with a frozen variance.

    freeze_step: warm-up length in steps (the paper suggests 15–25% of the run). group: the process
    group to communicate in (default: the whole world).
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        freeze_step: int = 100_000,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        require_step_count("freeze_step", freeze_step)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}, group)
        self.freeze_step = freeze_step

    def _warmup_step(self, step: int, entries: list[Entry]) -> bool:
        """Adam on the full-precision average of the gradients."""
        if not self._average_gradients(entries):
            return False
        for entry in entries:
            exp_avg, exp_avg_sq = self._moments(entry.param)
            update_moments(exp_avg, exp_avg_sq, entry.grad, entry.group["betas"])
            adam_step(entry, exp_avg, exp_avg_sq, step, step)
        return True

    def _compressed_step(self, step: int, entries: list[Entry]) -> bool:
        """Local momentum update, one compressed allreduce of m/(√v̂+ε), Adam step with the frozen variance."""
        moments = [self._moments(e.param) for e in entries]
        variances = [v for _, v in moments]
        denominators = [adam_denominator(v, e.group, self.freeze_step) for e, v in zip(entries, variances, strict=True)]
        local = [m.lerp(e.grad, 1 - e.group["betas"][0]) for e, (m, _) in zip(entries, moments, strict=True)]
        directions = self._average_preconditioned(local, denominators, variances, "momentum")
        if directions is None:
            return False
        for entry, (exp_avg, _), denominator, direction in zip(entries, moments, denominators, directions, strict=True):
            exp_avg.copy_(direction * denominator)
            apply_direction(entry, direction, step)
        return True
