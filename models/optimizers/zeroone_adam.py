"""0/1 Adam (Lu et al. 2022): adaptive variance freezing, then local steps synchronised in 1 bit.

Phase A (steps 1..var_freeze_step): the variance is refreshed, from gradients averaged in full
precision, only at steps whose interval starts at 1 and doubles after every `var_update_scaler`
refreshes (so the first `var_update_scaler` steps are plain Adam). At the other steps the gradients,
each divided by its current denominator √v̂+ε, are averaged by an error-compensated 1-bit allreduce
and only the momentum moves.

Phase B (after var_freeze_step, variance frozen): each rank steps with its own gradient and accumulates
its displacement u ← u·(1 − lr·wd) + lr·m̂/(√v̂+ε). At synchronisation steps (interval 1, doubling after
every `local_step_scaler` synchronisations, at most `local_step_clipper`) ū = 1-bit allreduce(u), every
rank moves to p = p_anchor·Π(1 − lr·wd) − ū, which is where the local steps would have led had they
all used ū, and rebuilds the momentum as ū·(√v̂+ε)/Σlr. The anchor, u, Σlr and Π are identical on
every rank after a synchronisation, so the parameters are too.

Both compress values in units of Adam steps (divided by √v̂+ε, identical on every rank) rather than
gradients or momenta: the paper's arithmetic when nothing is lost, but the 1-bit error can no longer
move an entry with a tiny variance by ±scale/√v (see CompressedOptimizer._average_preconditioned).

Bias correction: m̂ uses the step count, v̂ the number of variance refreshes.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from models.optimizers.base import (
    CompressedOptimizer,
    Entry,
    Frozen,
    Params,
    adam_denominator,
    adam_step,
    all_finite,
    bias_correction,
    fires,
    momentum_bound,
    require_step_count,
    schedule_events,
    unflatten,
    update_moments,
    zero_dead,
)

log = logging.getLogger(__name__)


class ZeroOneAdam(CompressedOptimizer):
    """0/1 Adam as a torch.optim.Optimizer; on one process it is Adam with a sparsely refreshed variance."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        var_freeze_step: int = 100_000,
        var_update_scaler: int = 16,
        local_step_scaler: int = 32_768,
        local_step_clipper: int = 16,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        require_step_count("var_freeze_step", var_freeze_step)
        require_step_count("var_update_scaler", var_update_scaler)
        require_step_count("local_step_scaler", local_step_scaler)
        require_step_count("local_step_clipper", local_step_clipper)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}, group)
        self.var_freeze_step = var_freeze_step
        self.var_update_scaler = var_update_scaler
        self.local_step_scaler = local_step_scaler
        self.local_step_clipper = local_step_clipper

    def refreshes_variance(self, step: int) -> bool:
        """Whether step number `step` refreshes the variance (full-precision gradient allreduce)."""
        return step <= self.var_freeze_step and fires(step, self.var_update_scaler)

    def variance_updates(self, step: int) -> int:
        """How many variance refreshes steps 1..step held (the variance's bias-correction count)."""
        return schedule_events(min(step, self.var_freeze_step), self.var_update_scaler)

    def synchronises(self, step: int) -> bool:
        """Whether step number `step` (a phase-B local step) ends with a 1-bit synchronisation."""
        local = step - self.var_freeze_step
        return local >= 1 and fires(local, self.local_step_scaler, self.local_step_clipper)

    def _needs_dense_gradients(self, step: int) -> bool:
        return self.refreshes_variance(step)

    def _update(self, step: int, entries: list[Entry]) -> bool:
        if step > self.var_freeze_step:
            self._local_step(step, entries)
            if self.synchronises(step):
                self._synchronise(step, entries)
            return True
        refresh = self.refreshes_variance(step)
        grads = self._averaged_gradients(step, entries, refresh)
        if grads is None:
            return False
        variance_updates = self.variance_updates(step)
        # Between refreshes the variance is frozen: its denominators are the ones the compression used.
        denominators = [None] * len(entries) if refresh else self._frozen_state(step, entries).divisors(entries)
        for entry, grad, denominator in zip(entries, grads, denominators, strict=True):
            exp_avg, exp_avg_sq = self._moments(entry.param)
            if refresh:
                update_moments(exp_avg, exp_avg_sq, grad, entry.group["betas"])
            else:
                exp_avg.lerp_(grad, 1 - entry.group["betas"][0])
            adam_step(entry, exp_avg, exp_avg_sq, step, variance_updates, denominator)
        return True

    def _averaged_gradients(self, step: int, entries: list[Entry], full_precision: bool) -> list[torch.Tensor] | None:
        """Phase A's gradients: averaged exactly on refresh steps, otherwise by the 1-bit allreduce of g/(√v̂+ε)."""
        if full_precision:
            return [e.grad for e in entries] if self._average_gradients(entries) else None
        frozen = self._frozen_state(step, entries)
        directions = self._average_preconditioned("gradient", entries, frozen, lambda e, out: out.copy_(e.grad))
        if directions is None:
            return None
        return [direction.mul_(d) for direction, d in zip(directions, frozen.divisors(entries), strict=True)]

    def _frozen_state(self, step: int, entries: list[Entry]) -> Frozen:
        """√v̂ + ε of every entry at this step (v̂ corrected for the refreshes so far), identical on every rank,
        and where v = 0; recomputed only when a refresh has changed the variance."""
        count = self.variance_updates(step)
        return self._frozen(
            "denominator",
            count,
            entries,
            lambda e, out: adam_denominator(self._moments(e.param)[1], e.group, count, out=out),
            lambda e: momentum_bound(e.group["betas"]),
        )

    def _local_step(self, step: int, entries: list[Entry]) -> None:
        """A rank-local Adam step with the frozen variance, accumulated for the next synchronisation.

        A rank whose gradient is not finite drops its own update (the others cannot know without a
        collective); the step still counts everywhere, so the schedules stay aligned.
        """
        states = [self._local_state(e.param) for e in entries]
        finite = all(all_finite(e.grad) for e in entries)
        if not finite:
            log.warning("0/1 Adam local step %d dropped on this rank: its gradient is not finite", step)
        frozen = self._frozen_state(step, entries)
        directions = unflatten(self._workspace(entries[0].param, frozen.divisor.numel()), [e.param for e in entries])
        for entry, state, denominator, dead, direction in zip(
            entries, states, frozen.divisors(entries), frozen.dead, directions, strict=True
        ):
            lr, keep = entry.group["lr"], 1 - entry.group["lr"] * entry.group["weight_decay"]
            # The decay and Σlr follow the schedule, not the data: they must match on every rank.
            if keep != 1:
                entry.param.mul_(keep)
                state["accumulated_update"].mul_(keep)
            state["lr_sum"] += lr
            state["decay"] *= keep
            if not finite:
                continue
            exp_avg = self._moments(entry.param)[0].lerp_(entry.grad, 1 - entry.group["betas"][0])
            zero_dead(exp_avg, dead)
            torch.div(exp_avg, denominator, out=direction).div_(bias_correction(entry.group["betas"][0], step))
            bound = momentum_bound(entry.group["betas"])  # a frozen variance gone stale must not fling the entry
            direction.clamp_(-bound, bound)
            entry.param.add_(direction, alpha=-lr)
            state["accumulated_update"].add_(direction, alpha=lr)

    def _synchronise(self, step: int, entries: list[Entry]) -> None:
        """Average the accumulated updates in 1 bit, move every rank to the common point, rebuild the momentum."""
        params = [e.param for e in entries]
        numel = sum(p.numel() for p in params)
        inputs = unflatten(self.comm.input_buffer("update", numel, params[0].device), params)
        for entry, local in zip(entries, inputs, strict=True):
            local.copy_(self.state[entry.param]["accumulated_update"])
        averaged = unflatten(self.comm.reduce("update").values, params)
        frozen = self._frozen_state(step, entries)
        for entry, update, denominator, dead in zip(
            entries, averaged, frozen.divisors(entries), frozen.dead, strict=True
        ):
            state = self.state[entry.param]
            exp_avg = self._moments(entry.param)[0]
            zero_dead(update, dead)
            entry.param.copy_(state["anchor"])
            if state["decay"] != 1:
                entry.param.mul_(state["decay"])
            entry.param.sub_(update)
            if state["lr_sum"] > 0:  # a zero learning rate all interval long leaves nothing to rebuild from
                scale = bias_correction(entry.group["betas"][0], step) / state["lr_sum"]
                torch.mul(update, denominator, out=exp_avg).mul_(scale)
            state["anchor"].copy_(entry.param)
            state["accumulated_update"].zero_()
            state["lr_sum"], state["decay"] = 0.0, 1.0

    def _local_state(self, param: torch.Tensor) -> dict:
        """Phase B's per-parameter state, created at the first local step (when all ranks still agree)."""
        state = self.state[param]
        if "anchor" not in state:
            state["anchor"] = param.detach().clone()
            state["accumulated_update"] = torch.zeros_like(param)
            state["lr_sum"], state["decay"] = 0.0, 1.0
        return state
