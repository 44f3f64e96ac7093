"""1-bit Adam (Tang et al. 2021): Adam whose momentum, once the variance is frozen, crosses the wire in 1 bit.

Warm-up (steps 1..freeze_step): Adam (torch's AdamW arithmetic: bias correction, decoupled weight
decay) on gradients averaged over ranks in full precision. Compression stage: the variance v stays
frozen; each rank folds its local gradient into the momentum, m ← β₁m + (1−β₁)g, the momenta of all
parameters, each divided by its frozen denominator √v̂+ε, are averaged in ONE error-compensated 1-bit
allreduce, and p ← p − lr·(m̂/(√v̂+ε) + wd·p). Compressing m/(√v̂+ε) rather than m is the paper's
algorithm with the compression error measured in Adam steps (see CompressedOptimizer._average_preconditioned):
it keeps entries with a tiny frozen variance from taking steps of ±scale/√v. Entries whose averaged
gradient was zero during the whole warm-up (v = 0) keep a zero momentum.

Under DDP with `ddp_overlap_hook` the compression stage runs one such allreduce per gradient bucket,
each as soon as backward has filled its bucket (models.optimizers.bucket_overlap), so communication
overlaps the rest of the backward pass; each bucket then has its own scales and error feedback.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations against the real types.

from functools import partial
from typing import NamedTuple

import torch
import torch.distributed as dist

from models.compressed_allreduce import CompressedAllreduce
from models.optimizers.base import (
    Entry,
    FreezingOptimizer,
    Frozen,
    Params,
    adam_denominator,
    adam_step,
    apply_direction,
    momentum_bound,
    require_step_count,
    update_moments,
)
from models.optimizers.bucket_overlap import BucketOverlap


class Averaged(NamedTuple):
    """One compressed average of momenta: its entries, their frozen constants, and the averaged m/(√v̂+ε)
    per entry (None when not finite)."""

    entries: list[Entry]
    frozen: Frozen
    directions: list[torch.Tensor] | None


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
        self._overlap: BucketOverlap[Averaged] | None = None

    @property
    def bytes_on_wire(self) -> int:
        overlapped = self._overlap.comm.bytes_on_wire if self._overlap else 0
        return super().bytes_on_wire + overlapped

    def reset_compression_errors(self) -> None:
        super().reset_compression_errors()
        if self._overlap:
            self._overlap.comm.reset_errors()

    def ddp_overlap_hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP communication hook: ddp_comm_hook's full-precision warm-up, then in the compression stage each
        bucket's momenta averaged in 1 bit while backward goes on (register it instead of ddp_comm_hook).

        The bucket's gradients stay local (DDP gets them back untouched); the next step() applies the
        averages. Under gradient accumulation, run the extra micro-batches' backward in ``ddp_model.no_sync()``:
        a second synchronising backward pass before step() raises (its buckets would be compressed twice).
        """
        step = self.step_count + 1
        if self.world_size == 1 or self._needs_dense_gradients(step):
            return self.ddp_comm_hook(state, bucket)
        groups = {id(p): g for g in self.param_groups for p in g["params"]}
        entries = [
            Entry(groups[id(p)], p, grad)
            for p, grad in zip(bucket.parameters(), bucket.gradients(), strict=True)
            if id(p) in groups and p.requires_grad
        ]
        if not entries:  # parameters this optimizer does not train
            return self.ddp_comm_hook(state, bucket)
        if self._overlap is None:
            self._overlap = BucketOverlap(self.process_group)
        overlap, index = self._overlap, bucket.index()
        job = partial(self._average_momenta, f"bucket{index}", entries, overlap.comm)
        return overlap.submit(step, index, job, bucket.buffer())

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
        """Local momentum update, compressed allreduce of m/(√v̂+ε) (one, or one per DDP bucket the overlap
        hook averaged during backward), Adam step with the frozen variance."""
        averaged = self._overlap.take(step) if self._overlap else []
        done = {id(entry.param) for average in averaged for entry in average.entries}
        rest = [entry for entry in entries if id(entry.param) not in done]
        if rest:
            averaged.append(self._average_momenta("rest", rest, self.comm))
        if any(average.directions is None for average in averaged):
            self.reset_compression_errors()  # every rank skips: the poisoned scales were gathered everywhere
            return False
        for entries_, frozen, directions in averaged:
            for entry, denominator, direction in zip(entries_, frozen.divisors(entries_), directions, strict=True):
                torch.mul(direction, denominator, out=self._moments(entry.param)[0])
                apply_direction(entry, direction, step)
        return True

    def _average_momenta(self, tag: str, entries: list[Entry], comm: CompressedAllreduce) -> Averaged:
        """The compressed average of the entries' preconditioned local momenta, under names of `tag`; the
        error feedback restarts when the tag's entries change."""
        name, key = f"momentum/{tag}", (self.freeze_step, tuple(id(entry.param) for entry in entries))
        if not self._frozen_is_current(tag, key, entries):
            comm.reset_errors(name)
        frozen = self._frozen(tag, key, entries, self._frozen_denominator, lambda e: momentum_bound(e.group["betas"]))
        directions = self._average_preconditioned(name, entries, frozen, self._local_momentum, comm)
        return Averaged(entries, frozen, directions)

    def _frozen_denominator(self, entry: Entry, out: torch.Tensor) -> None:
        adam_denominator(self._moments(entry.param)[1], entry.group, self.freeze_step, out=out)
