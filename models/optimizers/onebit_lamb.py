"""1-bit LAMB (Li et al. 2021): LAMB whose layer-wise scaling survives 1-bit momentum compression.

Warm-up (steps 1..freeze_step): LAMB on gradients averaged in full precision. Per tensor,
u = m̂/(√v̂+ε) + wd·p, trust ratio c = clip(‖p‖/‖u‖, min_coeff, max_coeff) (1 when a norm is 0),
p ← p − lr·c·u, and an exponential average of c (coeff_beta, started at the first c) becomes the
tensor's frozen coefficient.

Compression stage (v frozen): the local momenta m ← β₁m + (1−β₁)g of all tensors, each divided by its
frozen denominator √v̂+ε (so that the 1-bit error is in units of Adam steps and cannot move an entry with
a tiny variance by ±scale/√v, see CompressedOptimizer._average_preconditioned) and multiplied by a
scaling coefficient that gives every tensor the same RMS (fixed at the first compressed step, from the
momenta every rank shares), travel in ONE 1-bit allreduce. The reconstructed gradient
g̃ = (m_t − β₁m_{t−1})/(1−β₁) feeds a fresh variance; per tensor, factor = max over elements of
(√v̂_frozen+ε)/(√v̂_fresh+ε), clipped to [factor_min, factor_max] and then to within a relative
±factor_threshold of its previous value (1 at the start); p ← p − lr·coefficient·factor·u.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from models.optimizers.base import (
    Entry,
    FreezingOptimizer,
    Params,
    adam_denominator,
    bias_correction,
    momentum_bound,
    require,
    require_step_count,
    update_moments,
)


class OnebitLamb(FreezingOptimizer):
    """1-bit LAMB as a torch.optim.Optimizer; on one process the compression stage is uncompressed."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        freeze_step: int = 100_000,
        max_coeff: float = 10.0,
        min_coeff: float = 0.01,
        coeff_beta: float = 0.9,
        factor_max: float = 4.0,
        factor_min: float = 0.5,
        factor_threshold: float = 0.1,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        require_step_count("freeze_step", freeze_step)
        require(0 < min_coeff <= max_coeff, f"need 0 < min_coeff <= max_coeff, got {min_coeff} and {max_coeff}")
        require(0 <= coeff_beta < 1, f"coeff_beta must lie in [0, 1), got {coeff_beta}")
        require(
            0 < factor_min <= 1 <= factor_max,
            f"need 0 < factor_min <= 1 <= factor_max, got {factor_min} and {factor_max}",
        )
        require(factor_threshold >= 0, f"factor_threshold must be >= 0, got {factor_threshold}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}, group)
        self.freeze_step = freeze_step
        self.coeff_range = (min_coeff, max_coeff)
        self.coeff_beta = coeff_beta
        self.factor_range = (factor_min, factor_max)
        self.factor_threshold = factor_threshold

    def _warmup_step(self, step: int, entries: list[Entry]) -> bool:
        """LAMB on the full-precision average of the gradients; the trust ratios feed each tensor's coefficient."""
        if not self._average_gradients(entries):
            return False
        for entry in entries:
            state = self.state[entry.param]
            exp_avg, exp_avg_sq = self._moments(entry.param)
            update_moments(exp_avg, exp_avg_sq, entry.grad, entry.group["betas"])
            update = _lamb_update(entry, exp_avg, adam_denominator(exp_avg_sq, entry.group, step), step)
            ratio = self._trust_ratio(entry.param, update)
            previous = state.get("lamb_coeff", ratio)
            state["lamb_coeff"] = self.coeff_beta * previous + (1 - self.coeff_beta) * ratio
            entry.param.add_(update, alpha=-entry.group["lr"] * ratio)
        return True

    def _compressed_step(self, step: int, entries: list[Entry]) -> bool:
        """One fused 1-bit momentum allreduce, fresh variance from the momentum difference, frozen-coefficient step."""
        if any("scaling" not in self.state[e.param] for e in entries):
            self._start_compression(entries)
        frozen = self._frozen("denominator", self.freeze_step, entries, self._frozen_denominator)
        # Compressed: m/(√v̂+ε) (in units of Adam steps), times the tensor's scaling coefficient.
        units = self._frozen("unit", self.freeze_step, entries, self._unit, self._unit_bound)
        averaged = self._average_preconditioned("momentum", entries, units, self._local_momentum)
        if averaged is None:
            return False
        for entry, denominator, unit, new_avg in zip(
            entries, frozen.divisors(entries), units.divisors(entries), averaged, strict=True
        ):
            # In place, no fresh buffers: new_avg (the allreduce's output) becomes u, exp_avg holds g̃ and then
            # √v̂_fresh+ε before it takes the new momentum.
            state = self.state[entry.param]
            exp_avg = self._moments(entry.param)[0]
            beta1, beta2 = entry.group["betas"]
            new_avg.mul_(unit)
            grad = torch.sub(new_avg, exp_avg.mul_(beta1), out=exp_avg).div_(1 - beta1)
            state["exp_avg_sq_fresh"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            fresh = adam_denominator(state["exp_avg_sq_fresh"], entry.group, step, out=grad)
            state["factor"] = self._clip_factor(torch.div(denominator, fresh, out=fresh).max().item(), state["factor"])
            exp_avg.copy_(new_avg)
            update = _lamb_update(entry, exp_avg, denominator, step, out=new_avg)
            entry.param.add_(update, alpha=-entry.group["lr"] * state["lamb_coeff"] * state["factor"])
        return True

    def _frozen_denominator(self, entry: Entry, out: torch.Tensor | None = None) -> torch.Tensor:
        """√v̂ + ε of the variance frozen at the end of the warm-up (into out when given)."""
        return adam_denominator(self._moments(entry.param)[1], entry.group, self.freeze_step, out=out)

    def _unit_bound(self, entry: Entry) -> float:
        """The limit of m/unit: Adam's bound on |m|/√v, times the tensor's scaling coefficient."""
        return momentum_bound(entry.group["betas"]) * self.state[entry.param]["scaling"]

    def _unit(self, entry: Entry, out: torch.Tensor) -> None:
        """What the momentum is divided by before compression: √v̂+ε over the tensor's scaling coefficient."""
        self._frozen_denominator(entry, out).div_(self.state[entry.param]["scaling"])

    def _start_compression(self, entries: list[Entry]) -> None:
        """Fix the scaling coefficients (equal RMS of m/(√v̂+ε) per tensor); the fresh variance starts as the frozen one.

        The momenta here are the warm-up's, identical on every rank, so the coefficients are too.
        """
        directions = [self._moments(e.param)[0].div(self._frozen_denominator(e)) for e in entries]
        rms = [d.norm().item() / math.sqrt(max(d.numel(), 1)) for d in directions]
        nonzero = [r for r in rms if r > 0]
        target = sum(nonzero) / len(nonzero) if nonzero else 0.0
        for entry, r in zip(entries, rms, strict=True):
            state = self.state[entry.param]
            state["scaling"] = target / r if r > 0 else 1.0
            state["exp_avg_sq_fresh"] = self._moments(entry.param)[1].clone()
            state["factor"] = 1.0

    def _trust_ratio(self, param: torch.Tensor, update: torch.Tensor) -> float:
        """clip(‖p‖/‖u‖, min_coeff, max_coeff), 1 before clipping when either norm is zero."""
        weight_norm, update_norm = param.norm().item(), update.norm().item()
        ratio = weight_norm / update_norm if weight_norm > 0 and update_norm > 0 else 1.0
        return min(max(ratio, self.coeff_range[0]), self.coeff_range[1])

    def _clip_factor(self, factor: float, previous: float) -> float:
        """Clip the variance factor to its range, then to a relative ±factor_threshold of its previous value."""
        factor = min(max(factor, self.factor_range[0]), self.factor_range[1])
        low, high = previous * (1 - self.factor_threshold), previous * (1 + self.factor_threshold)
        return min(max(factor, low), high)


def _lamb_update(
    entry: Entry, exp_avg: torch.Tensor, denominator: torch.Tensor, step: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """u = m̂/(√v̂+ε) + wd·p, the direction LAMB scales per tensor (into out when given)."""
    update = torch.div(exp_avg, denominator, out=out).div_(bias_correction(entry.group["betas"][0], step))
    if entry.group["weight_decay"]:
        update.add_(entry.param, alpha=entry.group["weight_decay"])
    return update
