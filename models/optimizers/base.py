"""What the communication-compressed optimizers share: ranks, fused buffers, averaging, the DDP hook, Adam arithmetic.

Every decision an optimizer takes (full-precision or compressed step, variance refresh, local step,
skipping a non-finite step) is a function of the step count and of values that are identical on every
rank, so all ranks take the same branch and call the same collectives in the same order.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations against the real types.

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from models.compressed_allreduce import CompressedAllreduce
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


class Entry(NamedTuple):
    """One trainable parameter in a step: its group's options, the tensor, its gradient (zeros when it has none)."""

    group: dict[str, Any]
    param: torch.Tensor
    grad: torch.Tensor


def require(condition: bool, message: str) -> None:
    """Raise FilterForwardError(message) unless condition holds."""
    if not condition:
        raise FilterForwardError(message)


def require_step_count(name: str, value: object, minimum: int = 1) -> None:
    """Step counts and schedule sizes are whole numbers of at least `minimum`."""
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
        f"{name} must be a whole number >= {minimum}, got {value!r}",
    )


def bias_correction(beta: float, count: int) -> float:
    """1 − β^count: how far an exponential average started at zero is from unbiased after count updates."""
    return 1.0 - beta**count


def schedule_events(step: int, per_level: int, cap: int | None = None) -> int:
    """How many events fired at steps 1..step of a schedule whose interval starts at 1 and doubles
    after every `per_level` events, never beyond `cap` (0/1 Adam's variance refreshes and local syncs)."""
    events, start, interval = 0, 0, 1
    while cap is None or interval < cap:
        level_end = start + interval * per_level
        if step < level_end:
            break
        events, start = events + per_level, level_end
        interval = interval * 2 if cap is None else min(interval * 2, cap)
    return events + max(0, step - start) // interval


def fires(step: int, per_level: int, cap: int | None = None) -> bool:
    """Whether the schedule of schedule_events has an event at this step."""
    return step >= 1 and schedule_events(step, per_level, cap) > schedule_events(step - 1, per_level, cap)


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether no element is inf or NaN (min/max propagate both; one pass, far cheaper than isfinite)."""
    return tensor.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(tensor))).all())


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One new fp32 buffer holding the tensors back to back: what a fused collective sends."""
    return torch.cat([t.reshape(-1).float() for t in tensors])


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of flat shaped like the tensors of `like`, in order (the inverse of flatten)."""
    return [chunk.view_as(t) for chunk, t in zip(flat.split([t.numel() for t in like]), like, strict=True)]


def update_moments(
    exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, grad: torch.Tensor, betas: tuple[float, float]
) -> None:
    """Adam's moment updates in place: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g²."""
    exp_avg.lerp_(grad, 1 - betas[0])
    exp_avg_sq.mul_(betas[1]).addcmul_(grad, grad, value=1 - betas[1])


def adam_denominator(
    exp_avg_sq: torch.Tensor, group: dict[str, Any], variance_updates: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """√v̂ + ε with v̂ the bias-corrected variance after `variance_updates` updates (torch's Adam arithmetic),
    written into out when given."""
    correction = math.sqrt(bias_correction(group["betas"][1], variance_updates))
    return torch.sqrt(exp_avg_sq, out=out).div_(correction).add_(group["eps"])


def decay_weights(entry: Entry) -> None:
    """p ← p·(1 − lr·wd), decoupled weight decay (nothing to do, not even a pass over p, when wd = 0)."""
    if entry.group["weight_decay"]:
        entry.param.mul_(1 - entry.group["lr"] * entry.group["weight_decay"])


def adam_step(
    entry: Entry,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    variance_updates: int,
    denominator: torch.Tensor | None = None,
) -> None:
    """p ← p·(1 − lr·wd) − lr·m̂/(√v̂ + ε): torch's AdamW arithmetic, which is Adam's when wd = 0.

    denominator: √v̂ + ε when the caller has it already.
    """
    group = entry.group
    decay_weights(entry)
    step_size = group["lr"] / bias_correction(group["betas"][0], step)
    if denominator is None:
        denominator = adam_denominator(exp_avg_sq, group, variance_updates)
    entry.param.addcdiv_(exp_avg, denominator, value=-step_size)


def momentum_bound(betas: tuple[float, float]) -> float:
    """The largest |m|/√v plain Adam can reach, whatever its gradients: by Cauchy-Schwarz over the two exponential
    averages, (1−β₁)/√((1−β₂)(1−β₁²/β₂)), 7.3 for the default betas (inf when β₁² ≥ β₂: no bound)."""
    beta1, beta2 = betas
    if beta1**2 >= beta2:
        return math.inf
    return (1 - beta1) / math.sqrt((1 - beta2) * (1 - beta1**2 / beta2))


def zero_dead(values: torch.Tensor, dead: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
    """values with the entries at the indices `dead` (see Frozen) set to 0, in place."""
    if dead is not None:
        values.index_put_(dead, values.new_zeros(()))
    return values


def apply_direction(entry: Entry, direction: torch.Tensor, step: int) -> None:
    """p ← p·(1 − lr·wd) − lr·direction/(1 − β₁^step): adam_step with the division by √v̂ + ε already done."""
    decay_weights(entry)
    entry.param.add_(direction, alpha=-entry.group["lr"] / bias_correction(entry.group["betas"][0], step))


class Frozen(NamedTuple):
    """Per-element constants of a stage whose variance is frozen, computed once for the whole stage.

    divisor: flat, the entries back to back (what the 1-bit allreduce divides its input by); dead: per
    entry, the indices (one tensor per dimension) where the variance is 0 (None where it is nowhere), the
    entries whose gradient was always zero. A sign cannot say 0, so the decompressed value is ±scale
    there; zeroing them keeps those entries at exactly zero (the 1-bit Adam paper's momentum mask).
    Indices, not a boolean mask: they are few, and a masked fill reads the whole mask every time.
    limits: (low, high), flat like divisor, the range each divided value is clamped to before compression
    (None: none).
    """

    divisor: torch.Tensor
    dead: list[tuple[torch.Tensor, ...] | None]
    limits: tuple[torch.Tensor, torch.Tensor] | None = None

    def divisors(self, entries: Sequence[Entry]) -> list[torch.Tensor]:
        """The divisor of each entry, shaped like its parameter (views)."""
        return unflatten(self.divisor, [e.param for e in entries])


class CompressedOptimizer(torch.optim.Optimizer):
    """Base of OnebitAdam, ZeroOneAdam and OnebitLamb: subclasses implement `_update` and `_needs_dense_gradients`.

    Without an initialised process group (or with one rank) nothing is communicated and every
    optimizer runs its uncompressed arithmetic.
    """

    def __init__(self, params: Params, defaults: dict[str, Any], group: dist.ProcessGroup | None) -> None:
        lr, (beta1, beta2), eps, weight_decay = (defaults[k] for k in ("lr", "betas", "eps", "weight_decay"))
        require(lr >= 0, f"lr must be >= 0, got {lr}")
        require(0 <= beta1 < 1 and 0 <= beta2 < 1, f"betas must lie in [0, 1), got {defaults['betas']}")
        require(eps > 0, f"eps must be > 0 (it guards the divisions), got {eps}")
        require(weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, defaults)
        self.process_group = group
        self.comm = CompressedAllreduce(group)
        self.dense_bytes_on_wire = 0
        self._averaged_by_hook = False
        self._skipped_in_a_row = 0  # a skipped step is retried with the next batch: its warnings are thinned
        # Derived from frozen state, so never checkpointed: {tag: (key, Frozen)}; dropped on load_state_dict.
        self._frozen_cache: dict[str, tuple[object, Frozen]] = {}
        self._scratch = torch.empty(0)

    @property
    def world_size(self) -> int:
        """Ranks that share the optimizer step; 1 when torch.distributed is not initialised."""
        return self.comm.world_size

    @property
    def bytes_on_wire(self) -> int:
        """Bytes this rank has sent so far: compressed collectives plus full-precision allreduces (ring model)."""
        return self.comm.bytes_on_wire + self.dense_bytes_on_wire

    @property
    def step_count(self) -> int:
        """Steps taken so far (skipped steps do not count); every stage follows from it."""
        return max((self.state[p].get("step", 0) for g in self.param_groups for p in g["params"]), default=0)

    def reset_compression_errors(self) -> None:
        """Drop the error-feedback buffers, as a checkpoint round trip does (they are never saved)."""
        self.comm.reset_errors()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load moments, step and stage state; the error-feedback buffers restart from zero."""
        super().load_state_dict(state_dict)
        self.reset_compression_errors()
        self._frozen_cache.clear()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One optimizer step on every rank (all ranks must call it, with their local gradients)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        entries = [
            Entry(group, p, self._gradient(p))
            for group in self.param_groups
            for p in group["params"]
            if p.requires_grad
        ]
        step = self.step_count + 1
        try:
            applied = self._update(step, entries) if entries else True
        finally:
            self._averaged_by_hook = False
        if applied:
            for entry in entries:
                self.state[entry.param]["step"] = step
            self._skipped_in_a_row = 0
        else:
            self._report_skip(step)
        return loss

    def _report_skip(self, step: int) -> None:
        """Warn at the 1st, 10th, 100th... skip in a row: a diverged run retries the same step on every batch."""
        self._skipped_in_a_row += 1
        times = self._skipped_in_a_row
        if times == 10 ** round(math.log10(times)):
            again = f" ({times} times in a row)" if times > 1 else ""
            log.warning(
                "%s step %d skipped on every rank%s: the averaged values are not finite",
                type(self).__name__,
                step,
                again,
            )

    def _gradient(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter's gradient; zeros when it has none, so every rank sends the same fused buffers."""
        if param.grad is None:
            return torch.zeros_like(param)
        require(
            param.grad.layout == torch.strided,
            f"{type(self).__name__} got a sparse gradient for a {tuple(param.shape)} parameter: "
            "use dense gradients (e.g. nn.Embedding(..., sparse=False))",
        )
        return param.grad

    def _update(self, step: int, entries: list[Entry]) -> bool:
        """Apply step number `step`; False when it was skipped (identically on every rank)."""
        raise NotImplementedError

    def _needs_dense_gradients(self, step: int) -> bool:
        """Whether step number `step` averages the gradients in full precision."""
        raise NotImplementedError

    def _average_gradients(self, entries: list[Entry]) -> bool:
        """Average the gradients over ranks in full precision, in place; False when the average is not finite."""
        grads = [e.grad for e in entries]
        flat = flatten(grads)
        world = self.world_size
        if world > 1 and not self._averaged_by_hook:
            dist.all_reduce(flat, group=self.process_group)
            flat.div_(world)
            self._count_dense(flat, world)
            for grad, averaged in zip(grads, unflatten(flat, grads), strict=True):
                grad.copy_(averaged)
        return all_finite(flat)

    def _frozen_is_current(self, tag: str, key: object, entries: list[Entry]) -> bool:
        """Whether _frozen(tag, key, entries) would return cached constants."""
        cached = self._frozen_cache.get(tag)
        return cached is not None and cached[0] == (key, len(entries))

    def _frozen(
        self,
        tag: str,
        key: object,
        entries: list[Entry],
        divisor: Callable[[Entry, torch.Tensor], object],
        bound: Callable[[Entry], float] | None = None,
    ) -> Frozen:
        """The Frozen constants of `tag` for `key` (built with divisor(entry, out) on first use, then cached
        until the key changes): the variance they derive from does not change while the key stays. bound(entry):
        the limit of the entry's divided values."""
        if self._frozen_is_current(tag, key, entries):
            return self._frozen_cache[tag][1]
        flat = entries[0].param.new_empty(sum(e.param.numel() for e in entries), dtype=torch.float32)
        dead = []
        for entry, out in zip(entries, unflatten(flat, [e.param for e in entries]), strict=True):
            divisor(entry, out)
            zero = self._moments(entry.param)[1] == 0
            dead.append(zero.nonzero(as_tuple=True) if zero.any() else None)
        limits = None
        if bound is not None:
            high = torch.cat([flat.new_full((e.param.numel(),), bound(e)) for e in entries])
            limits = (-high, high)
        frozen = Frozen(flat, dead, limits)
        self._frozen_cache[tag] = ((key, len(entries)), frozen)
        return frozen

    def _workspace(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        """A flat fp32 scratch buffer of numel elements, reused across steps (fresh big buffers cost page faults)."""
        if self._scratch.numel() < numel or self._scratch.device != like.device:
            self._scratch = like.new_empty(numel, dtype=torch.float32)
        return self._scratch[:numel]

    def _average_preconditioned(
        self,
        name: str,
        entries: list[Entry],
        frozen: Frozen,
        fill: Callable[[Entry, torch.Tensor], torch.Tensor],
        comm: CompressedAllreduce | None = None,
    ) -> list[torch.Tensor] | None:
        """The 1-bit average of fill(entry)/divisor per entry (0 where dead), as views shaped like the parameters
        (valid until the next call); None when it is not finite. comm: the allreduce to use (default self.comm).

        fill(entry, out) writes the entry's values straight into the allreduce's input buffer. A non-finite input
        on any rank makes the result non-finite on every rank (the scales carry it), so the skip is decided
        identically everywhere; the poisoned error buffers are dropped.

        The signs share one scale, the RMS of everything compressed. In momentum (or gradient) units
        that scale is set by the largest entries, and an entry whose variance is tiny would then move
        by ±scale/√v — hundreds of Adam steps (measured: 0.33 per step with lr 1e-3 on a full-frame MC,
        whose max over cells leaves most gradients near zero). Divided by the denominator √v̂ + ε,
        which is identical on every rank, every entry is in units of an Adam step, so the compression
        error and its feedback are too; the average is the same linear function of the inputs.

        Divided, each value is clamped to frozen.limits (momentum_bound: a ratio plain Adam's m/√v never reaches;
        a gradient clamped to it keeps the momentum it feeds within it too). The variance froze after a short
        warm-up, so an entry whose gradients were tiny then and are not now shows a ratio of hundreds; through
        the shared scale that one entry moved EVERY entry by many Adam steps, and a short run blew up (windowed
        MC, 60 steps, 2 ranks: |m|/√v̂ up to 1080 at the first compressed step, loss NaN by step 19; clamped, it
        trains as on one rank).
        """
        comm = comm or self.comm
        params = [e.param for e in entries]
        numel = sum(p.numel() for p in params)
        local = unflatten(comm.input_buffer(name, numel, params[0].device), params)
        for entry, out, dead in zip(entries, local, frozen.dead, strict=True):
            zero_dead(fill(entry, out), dead)
        values, finite = comm.reduce(name, frozen.divisor, frozen.limits)
        if not finite:
            return None
        averaged = unflatten(values, params)
        for value, dead in zip(averaged, frozen.dead, strict=True):
            zero_dead(value, dead)
        return averaged

    def _count_dense(self, tensor: torch.Tensor, world: int) -> None:
        """Add what a ring allreduce of tensor sends per rank: 2·(n−1)/n of its bytes."""
        self.dense_bytes_on_wire += 2 * (world - 1) * tensor.numel() * tensor.element_size() // world

    def ddp_comm_hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP communication hook: average a bucket in full precision only on the steps that need it.

        On every other step DDP leaves the local gradients alone and the optimizer communicates them
        compressed itself. Register it with ``ddp_model.register_comm_hook(None, optimizer.ddp_comm_hook)``.
        """
        buffer = bucket.buffer()
        world = self.world_size
        if world == 1 or not self._needs_dense_gradients(self.step_count + 1):
            future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            future.set_result(buffer)
            return future
        self._averaged_by_hook = True
        self._count_dense(buffer, world)
        work = dist.all_reduce(buffer.div_(world), group=self.process_group, async_op=True)
        return work.get_future().then(lambda done: done.value()[0])

    def _local_momentum(self, entry: Entry, out: torch.Tensor) -> torch.Tensor:
        """β₁m + (1−β₁)g with this rank's gradient, into out (m itself is replaced only if the step is taken)."""
        return torch.lerp(self._moments(entry.param)[0], entry.grad, 1 - entry.group["betas"][0], out=out)

    def _moments(self, param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The parameter's first and second moments (exp_avg, exp_avg_sq), zeros on first use."""
        state = self.state[param]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state["exp_avg"], state["exp_avg_sq"]


class FreezingOptimizer(CompressedOptimizer):
    """A warm-up stage on full-precision averaged gradients for `freeze_step` steps, then the compression stage
    (1-bit Adam and 1-bit LAMB); subclasses set `freeze_step` and define the two stages."""

    freeze_step: int

    def _needs_dense_gradients(self, step: int) -> bool:
        return step <= self.freeze_step

    def _update(self, step: int, entries: list[Entry]) -> bool:
        if step <= self.freeze_step:
            return self._warmup_step(step, entries)
        return self._compressed_step(step, entries)

    def _warmup_step(self, step: int, entries: list[Entry]) -> bool:
        raise NotImplementedError

    def _compressed_step(self, step: int, entries: list[Entry]) -> bool:
        raise NotImplementedError
