"""The compressed optimizers in real gloo process groups: warm-up arithmetic, compression stages, checkpoints, DDP.

Each spawn runs many cases (a spawn costs seconds, a case milliseconds): two module-scoped fixtures start
one group of 2 ranks and one of 3, and the tests assert on what the ranks returned.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from distributed import run_workers
from torch import nn
from torch.nn.utils import parameters_to_vector

from models.compressed_allreduce import CompressedAllreduce, dense_reference
from models.errors import FilterForwardError
from models.microclassifiers import build_mc
from models.optimizers import OnebitAdam, OnebitLamb, ZeroOneAdam
from models.optimizers.base import CompressedOptimizer, unflatten
from models.training import TrainConfig, check_finite

FEATURES, HIDDEN, CLASSES = 6, 8, 3
LR = 1e-2

# Short stages so that a few steps visit every one; ZeroOneAdam: refreshes at 1, 2, 4, 6; phase B from
# step 9 with synchronisations at 9, 10, 12, 14, 18, 22, ...
CONFIGS: dict[str, tuple[type[CompressedOptimizer], dict]] = {
    "onebit_adam": (OnebitAdam, {"lr": LR, "freeze_step": 3}),
    "zeroone_adam": (
        ZeroOneAdam,
        {"lr": LR, "var_freeze_step": 8, "var_update_scaler": 2, "local_step_scaler": 2, "local_step_clipper": 4},
    ),
    "onebit_lamb": (OnebitLamb, {"lr": LR, "freeze_step": 3, "weight_decay": 0.01}),
}


# ---------------------------------------------------------------------------------------------- helpers


def _model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES))


def _batch(rank: int, step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's own batch of a 3-class problem; input 0 is always zero, so its weights never get a gradient."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, FEATURES, generator=generator)
    x[:, 0] = 0
    y = (x[:, 1] + x[:, 2] > 0).long() + (x[:, 3] * x[:, 4] > 0.5).long()
    return x, y


def _backward(model: nn.Module, rank: int, step: int) -> None:
    for p in model.parameters():
        p.grad = None
    _accumulate(model, rank, step)


def _accumulate(model: nn.Module, rank: int, step: int) -> None:
    """Add the step's batch's gradients to the parameters' .grad."""
    x, y = _batch(rank, step)
    F.cross_entropy(model(x), y).backward()


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, steps: range) -> list[torch.Tensor]:
    """Run the steps; the flat parameters after each."""
    trajectory = []
    for step in steps:
        _backward(model, rank, step)
        optimizer.step()
        trajectory.append(_flat(model))
    return trajectory


def _flat(model: nn.Module) -> torch.Tensor:
    return parameters_to_vector(model.parameters()).detach().clone()


def _build(name: str, model: nn.Module, **overrides: object) -> CompressedOptimizer:
    cls, options = CONFIGS[name]
    return cls(model.parameters(), **(options | overrides))


def _average_grads(model: nn.Module, world: int) -> None:
    """What DDP does: every gradient becomes the mean over ranks."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def _lamb_reference(model: nn.Module, state: dict, step: int, lr: float, weight_decay: float) -> None:
    """LAMB from the formula (bias-corrected moments, trust ratio clipped to [0.01, 10], EMA 0.9 of it)."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    with torch.no_grad():
        for index, p in enumerate(model.parameters()):
            s = state.setdefault(index, {"m": torch.zeros_like(p), "v": torch.zeros_like(p)})
            s["m"] = beta1 * s["m"] + (1 - beta1) * p.grad
            s["v"] = beta2 * s["v"] + (1 - beta2) * p.grad**2
            m_hat, v_hat = s["m"] / (1 - beta1**step), s["v"] / (1 - beta2**step)
            u = m_hat / (v_hat.sqrt() + eps) + weight_decay * p
            ratio = (p.norm() / u.norm()).item() if p.norm() > 0 and u.norm() > 0 else 1.0
            ratio = min(max(ratio, 0.01), 10.0)
            s["coeff"] = ratio if "coeff" not in s else 0.9 * s["coeff"] + 0.1 * ratio
            p -= lr * ratio * u


def _lamb_compressed_reference(
    model: nn.Module, state: dict, step: int, freeze_step: int, lr: float, wd: float
) -> None:
    """1-bit LAMB's compression stage from the formula, on one process (the allreduce is the identity)."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    with torch.no_grad():
        for index, p in enumerate(model.parameters()):
            s = state[index]
            s.setdefault("fresh", s["v"].clone())
            previous_m, previous_factor = s["m"], s.get("factor", 1.0)
            s["m"] = torch.where(s["v"] > 0, beta1 * previous_m + (1 - beta1) * p.grad, 0.0)
            grad = (s["m"] - beta1 * previous_m) / (1 - beta1)
            s["fresh"] = beta2 * s["fresh"] + (1 - beta2) * grad**2
            frozen = (s["v"] / (1 - beta2**freeze_step)).sqrt() + eps
            fresh = (s["fresh"] / (1 - beta2**step)).sqrt() + eps
            factor = min(max((frozen / fresh).max().item(), 0.5), 4.0)
            s["factor"] = min(max(factor, 0.9 * previous_factor), 1.1 * previous_factor)
            u = s["m"] / (1 - beta1**step) / frozen + wd * p
            p -= lr * s["coeff"] * s["factor"] * u


# ------------------------------------------------------------------------------------- 2 ranks: bodies


def _warmup_differences(rank: int, world: int) -> dict[str, float]:
    """Largest |ours − reference| over 4 warm-up steps, references fed the same averaged gradients."""
    pairs = {
        "onebit_adam/Adam": (
            lambda m: OnebitAdam(m.parameters(), lr=LR, freeze_step=4),
            lambda m: torch.optim.Adam(m.parameters(), lr=LR),
        ),
        "onebit_adam/AdamW": (
            lambda m: OnebitAdam(m.parameters(), lr=LR, weight_decay=0.1, freeze_step=4),
            lambda m: torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=0.1),
        ),
        "zeroone_adam/Adam": (
            lambda m: ZeroOneAdam(m.parameters(), lr=LR, var_update_scaler=4),
            lambda m: torch.optim.Adam(m.parameters(), lr=LR),
        ),
    }
    differences = {}
    for name, (ours, theirs) in pairs.items():
        model, reference = _model(), _model()
        optimizer, reference_optimizer = ours(model), theirs(reference)
        worst = 0.0
        for step in range(1, 5):
            _train(model, optimizer, rank, range(step, step + 1))
            _backward(reference, rank, step)
            _average_grads(reference, world)
            reference_optimizer.step()
            worst = max(worst, (_flat(model) - _flat(reference)).abs().max().item())
        differences[name] = worst

    model, reference, lamb_state = _model(), _model(), {}
    optimizer = OnebitLamb(model.parameters(), lr=LR, weight_decay=0.01, freeze_step=4)
    worst = 0.0
    for step in range(1, 5):
        _train(model, optimizer, rank, range(step, step + 1))
        _backward(reference, rank, step)
        _average_grads(reference, world)
        _lamb_reference(reference, lamb_state, step, LR, 0.01)
        worst = max(worst, (_flat(model) - _flat(reference)).abs().max().item())
    differences["onebit_lamb/LAMB"] = worst
    coeffs = [optimizer.state[p]["lamb_coeff"] for p in model.parameters()]
    differences["onebit_lamb/coefficients"] = max(abs(a - lamb_state[i]["coeff"]) for i, a in enumerate(coeffs))
    return differences


def _preconditioned_momentum(p: torch.Tensor, optimizer: OnebitAdam) -> torch.Tensor:
    """What 1-bit Adam (freeze_step 3) compresses for p at its first compressed step: the local momentum over the
    frozen √v̂+ε, zero where v = 0."""
    state = optimizer.state[p]
    denominator = state["exp_avg_sq"].sqrt() / math.sqrt(1 - 0.999**3) + 1e-8
    return torch.where(state["exp_avg_sq"] > 0, state["exp_avg"].lerp(p.grad, 0.1), 0.0) / denominator


def _first_compressed_step(rank: int, world: int) -> dict[str, float]:
    """OnebitAdam's first compressed step against the dense compression reference fed every rank's m/(√v̂+ε)."""
    model = _model()
    start = model[0].weight[:, 0].detach().clone()
    optimizer = OnebitAdam(model.parameters(), lr=LR, freeze_step=3)
    _train(model, optimizer, rank, range(1, 4))
    _backward(model, rank, 4)
    params = list(model.parameters())
    states = [optimizer.state[p] for p in params]
    local = torch.cat([_preconditioned_momentum(p, optimizer).reshape(-1) for p in params])
    everyone = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(everyone, local)
    averaged = dense_reference(everyone)[0]
    expected = []
    with torch.no_grad():
        for p, s, direction in zip(params, states, unflatten(averaged, params), strict=True):
            direction = torch.where(s["exp_avg_sq"] > 0, direction, 0.0)
            expected.append((p - LR / (1 - 0.9**4) * direction).reshape(-1))
    optimizer.step()
    difference = (_flat(model) - torch.cat(expected)).abs().max().item()
    _train(model, optimizer, rank, range(5, 9))
    return {"difference": difference, "dead_weights_moved": (model[0].weight[:, 0] - start).abs().max().item()}


def _nonfinite_steps(rank: int, world: int) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """(step count, params) after each call. OnebitAdam: rank 0 sends inf at call 1 (warm-up), rank 1 at
    call 4 (compressed). ZeroOneAdam: rank 1 sends inf at call 11, a local step before the sync at 12."""
    histories = {}
    for name, poisoned in (("onebit_adam", ((1, 0), (4, 1))), ("zeroone_adam", ((11, 1),))):
        model = _model()
        # ZeroOneAdam with weight decay: the decay product must stay the same on every rank.
        optimizer = (
            _build(name, model, freeze_step=2) if name == "onebit_adam" else _build(name, model, weight_decay=0.1)
        )
        histories[name] = []
        for call in range(1, 15):
            _backward(model, rank, call)
            if (call, rank) in poisoned:
                model[2].bias.grad[0] = math.inf
            optimizer.step()
            histories[name].append((optimizer.step_count, _flat(model)))
    return histories


def _ddp_differences(rank: int, world: int) -> dict[str, float]:
    """Largest |DDP with the optimizer's comm hook − the optimizer alone| over every stage."""
    differences = {}
    for name in ("onebit_adam", "zeroone_adam", "onebit_lamb"):
        alone, wrapped = _model(), _model()
        alone_optimizer, wrapped_optimizer = _build(name, alone), _build(name, wrapped)
        ddp = nn.parallel.DistributedDataParallel(wrapped)
        ddp.register_comm_hook(None, wrapped_optimizer.ddp_comm_hook)
        worst = 0.0
        for step in range(1, 15):
            _train(alone, alone_optimizer, rank, range(step, step + 1))
            _train(ddp, wrapped_optimizer, rank, range(step, step + 1))
            worst = max(worst, (_flat(alone) - _flat(wrapped)).abs().max().item())
        differences[name] = worst
    return differences


def _overlap_ddp(
    model: nn.Module, optimizer: OnebitAdam, buckets: list[list[int]], find_unused_parameters: bool = False
) -> nn.Module:
    """model under DDP, one bucket per parameter, with 1-bit Adam's overlap hook; each call's bucket (the indices
    of its parameters in model.parameters()) is appended to buckets."""
    position = {id(p): index for index, p in enumerate(model.parameters())}
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1e-5, find_unused_parameters=find_unused_parameters)

    def hook(state, bucket):  # unannotated: DDP checks annotations, and this module's are strings
        buckets.append([position[id(p)] for p in bucket.parameters()])
        return optimizer.ddp_overlap_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    return ddp


def _overlapped(rank: int, world: int) -> dict:
    """1-bit Adam with the overlap hook: its first compressed step against the dense reference fed, per bucket,
    every rank's m/(√v̂+ε) in bucket order; parameters on every rank; a skipped non-finite step; convergence."""
    model = _model()
    optimizer = OnebitAdam(model.parameters(), lr=LR, freeze_step=3)
    buckets: list[list[int]] = []
    ddp = _overlap_ddp(model, optimizer, buckets)
    _train(ddp, optimizer, rank, range(1, 4))
    _backward(ddp, rank, 4)  # step 4, the first compressed one: the hooks ran, the step has not
    params = list(model.parameters())
    first = buckets[-len(params) :]  # the hooks of step 4
    expected = [p.detach().clone() for p in params]
    for bucket in first:
        flat = torch.cat([_preconditioned_momentum(params[index], optimizer).reshape(-1) for index in bucket])
        everyone = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(everyone, flat)
        averaged = dense_reference(everyone)[0]
        for index, direction in zip(bucket, unflatten(averaged, [params[i] for i in bucket]), strict=True):
            direction = torch.where(optimizer.state[params[index]]["exp_avg_sq"] > 0, direction, 0.0)
            expected[index] -= LR / (1 - 0.9**4) * direction
    unbucketed_bytes = optimizer.comm.bytes_on_wire
    optimizer.step()
    difference = max((p - e).abs().max().item() for p, e in zip(params, expected, strict=True))

    step_counts = []
    for step in range(5, 10):
        for p in params:
            p.grad = None
        x, y = _batch(rank, step)
        if step == 7 and rank == 1:
            x[0, 1] = math.inf  # every gradient of this rank non-finite, in every bucket
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        step_counts.append(optimizer.step_count)
    _train(ddp, optimizer, rank, range(10, CONVERGENCE_STEPS + 1))
    return {
        "accumulation": _accumulated(ddp, optimizer, rank),
        "buckets": first,
        "difference": difference,
        "sent_outside_the_hooks": optimizer.comm.bytes_on_wire - unbucketed_bytes,
        "step_counts": step_counts,
        "params": _flat(model),
        "loss": _evaluation_loss(model),
        "adam_loss": _adam_loss(rank, world),
        "with_unused": _overlapped_with_unused_parameters(rank),
    }


def _accumulated(ddp: nn.Module, optimizer: OnebitAdam, rank: int) -> dict:
    """Gradient accumulation under the overlap hook: two micro-batches (the first under no_sync()) and a step;
    then two synchronising backward passes before a step, the second refused: (steps taken, its error)."""
    before = optimizer.step_count
    with ddp.no_sync():
        _backward(ddp, rank, 1000)
    _accumulate(ddp, rank, 1001)
    optimizer.step()
    _backward(ddp, rank, 1002)
    try:
        _accumulate(ddp, rank, 1003)
    except Exception as error:  # DDP re-raises the hook's error as its own type
        return {"steps": optimizer.step_count - before, "error": str(error)}
    return {"steps": optimizer.step_count - before, "error": ""}


class _WithUnused(nn.Module):
    """_model() beside a layer the forward pass never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = _model(), nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _overlapped_with_unused_parameters(rank: int) -> dict:
    """The overlap hook under find_unused_parameters, whose usage-map allreduce DDP issues from the backward
    thread while the hook's worker communicates: (step count, flat parameters) after 12 steps."""
    model = _WithUnused()
    optimizer = OnebitAdam(model.parameters(), lr=LR, freeze_step=3)
    ddp = _overlap_ddp(model, optimizer, [], find_unused_parameters=True)
    _train(ddp, optimizer, rank, range(1, 13))
    return {"steps": optimizer.step_count, "params": _flat(model)}


# A full-frame MC in miniature: a per-cell MLP whose logit is the max over cells, on sparse features (feature k
# is active with probability 10^(-k/4)): the max leaves most gradient entries near zero, so the frozen
# variance of many entries is tiny but not zero (the mask for v = 0 does not cover them).
CELLS, CELL_FEATURES, CELL_HIDDEN = 24, 12, 16
CELLS_FREEZE, CELLS_STEPS = 20, 60


def _cells_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(CELL_FEATURES, CELL_HIDDEN), nn.ReLU(), nn.Linear(CELL_HIDDEN, 1))


def _cells_loss(model: nn.Module, rank: int, step: int, size: int = 16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    density = torch.logspace(0, -2.5, CELL_FEATURES)
    active = torch.rand(size, CELLS, CELL_FEATURES, generator=generator) < density
    x = torch.randn(size, CELLS, CELL_FEATURES, generator=generator).relu() * active
    y = (x[..., 0].amax(dim=1) > 1.5).float()
    return F.binary_cross_entropy_with_logits(model(x).squeeze(-1).amax(dim=1), y)


def _cells_run(rank: int, optimizer: Callable[[nn.Module], torch.optim.Optimizer], step: Callable) -> dict:
    """Largest |Δp| of each step and the final evaluation loss; step(optimizer, model, step) after backward."""
    model = _cells_model()
    opt = optimizer(model)
    jumps = []
    for number in range(1, CELLS_STEPS + 1):
        opt.zero_grad()
        _cells_loss(model, rank, number).backward()
        before = _flat(model)
        step(opt, model, number)
        jumps.append((_flat(model) - before).abs().max().item())
    with torch.no_grad():
        loss = _cells_loss(model, rank=99, step=0, size=512).item()
    return {"jumps": jumps, "loss": loss, "optimizer": opt}


def _momentum_compressed_step(adam: torch.optim.Adam, model: nn.Module, step: int, comm: CompressedAllreduce) -> None:
    """1-bit Adam as the paper writes it: warm-up = Adam on averaged gradients, then the momentum m itself
    (masked where v = 0) is compressed and p ← p − lr·m̂/(√v̂+ε) with v frozen at CELLS_FREEZE."""
    params = list(model.parameters())
    if step <= CELLS_FREEZE:
        _average_grads(model, dist.get_world_size())
        adam.step()
        return
    states = [adam.state[p] for p in params]
    local = [
        torch.where(s["exp_avg_sq"] > 0, s["exp_avg"].lerp(p.grad, 0.1), 0.0)
        for p, s in zip(params, states, strict=True)
    ]
    averaged = comm.allreduce(torch.cat([m.reshape(-1) for m in local]), "momentum")
    with torch.no_grad():
        for p, s, m in zip(params, states, unflatten(averaged, params), strict=True):
            s["exp_avg"].copy_(torch.where(s["exp_avg_sq"] > 0, m, 0.0))
            denominator = s["exp_avg_sq"].sqrt() / math.sqrt(1 - 0.999**CELLS_FREEZE) + 1e-8
            p -= LR / (1 - 0.9**step) * s["exp_avg"] / denominator


def _tiny_variance(rank: int, world: int) -> dict:
    """The paper's momentum compression, ours, and Adam (gradients averaged) on the max-over-cells problem."""
    comm = CompressedAllreduce()
    plain = _cells_run(
        rank,
        lambda m: torch.optim.Adam(m.parameters(), lr=LR),
        lambda opt, m, step: _momentum_compressed_step(opt, m, step, comm),
    )
    variance = torch.cat([s["exp_avg_sq"].reshape(-1) for s in plain.pop("optimizer").state.values()])
    results = {"plain": plain, "variance": variance}
    results["adam"] = _cells_run(
        rank,
        lambda m: torch.optim.Adam(m.parameters(), lr=LR),
        lambda opt, m, step: (_average_grads(m, world), opt.step()),
    )
    ours = {
        "onebit_adam": lambda m: OnebitAdam(m.parameters(), lr=LR, freeze_step=CELLS_FREEZE),
        "onebit_lamb": lambda m: OnebitLamb(m.parameters(), lr=0.05, freeze_step=CELLS_FREEZE),
        "zeroone_adam": lambda m: ZeroOneAdam(
            m.parameters(), lr=LR, var_freeze_step=2 * CELLS_FREEZE, var_update_scaler=4, local_step_scaler=4
        ),
    }
    for name, build in ours.items():
        results[name] = _cells_run(rank, build, lambda opt, m, step: opt.step())
    for result in results.values():
        if isinstance(result, dict):
            result.pop("optimizer", None)
    return results


def _trajectory(name: str, rank: int, steps: int) -> list[torch.Tensor]:
    model = _model()
    return _train(model, _build(name, model), rank, range(1, steps + 1))


def _two_ranks(rank: int, world: int) -> dict:
    return {
        "warmup": _warmup_differences(rank, world),
        "first_compressed": _first_compressed_step(rank, world),
        "trajectories": {name: _trajectory(name, rank, 22) for name in CONFIGS},
        "nonfinite": _nonfinite_steps(rank, world),
        "ddp": _ddp_differences(rank, world),
        "tiny_variance": _tiny_variance(rank, world),
        "overlapped": _overlapped(rank, world),
    }


# ------------------------------------------------------------------------------------- 3 ranks: bodies
# (an odd world size: the compressed buffers need padding)

# (optimizer, step after which the checkpoint is saved): warm-up (the resumed run crosses the freeze),
# compression stage, and for ZeroOneAdam phase A between refreshes and phase B in mid interval.
CHECKPOINTS = [
    ("onebit_adam", 2),
    ("onebit_adam", 5),
    ("zeroone_adam", 2),
    ("zeroone_adam", 5),
    ("zeroone_adam", 11),
    ("onebit_lamb", 2),
    ("onebit_lamb", 5),
]
LAST_STEP = 16


def _round_trip(name: str, saved_at: int, rank: int) -> dict:
    """Params at LAST_STEP going straight on vs after saving, loading into a fresh model and optimizer, resuming.

    The error-feedback buffers are not in a checkpoint, so the straight run drops them at the save too.
    """
    model = _model()
    optimizer = _build(name, model)
    _train(model, optimizer, rank, range(1, saved_at + 1))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    optimizer.reset_compression_errors()
    straight = _train(model, optimizer, rank, range(saved_at + 1, LAST_STEP + 1))[-1]

    buffer.seek(0)
    checkpoint = torch.load(buffer)
    restored_model = _model(seed=1)
    restored_model.load_state_dict(checkpoint["model"])
    restored = _build(name, restored_model)
    restored.load_state_dict(checkpoint["optimizer"])
    restored_step = restored.step_count
    resumed = _train(restored_model, restored, rank, range(saved_at + 1, LAST_STEP + 1))[-1]
    return {"straight": straight, "resumed": resumed, "restored_step": restored_step}


CONVERGENCE_STEPS = 150
CONVERGENCE_CONFIGS = {  # stages sized like a real run: warm-up 20%, 0/1 Adam's phase B in the second half
    "onebit_adam": {"freeze_step": 30},
    "zeroone_adam": {"var_freeze_step": 75, "var_update_scaler": 8, "local_step_scaler": 8, "local_step_clipper": 8},
    # LAMB's lr is relative to each tensor's norm (trust ratio), so its scale differs from Adam's.
    "onebit_lamb": {"freeze_step": 30, "lr": 0.05},
}


def _evaluation_loss(model: nn.Module) -> float:
    x, y = _batch(rank=99, step=0, size=1024)
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


def _adam_loss(rank: int, world: int) -> float:
    """Final evaluation loss of Adam on DDP-style averaged gradients after CONVERGENCE_STEPS."""
    model = _model()
    adam = torch.optim.Adam(model.parameters(), lr=LR)
    for step in range(1, CONVERGENCE_STEPS + 1):
        _backward(model, rank, step)
        _average_grads(model, world)
        adam.step()
    return _evaluation_loss(model)


def _convergence(rank: int, world: int) -> dict:
    """Final evaluation loss of Adam (DDP-style averaging) and of each compressed optimizer, same data and budget."""
    results = {"adam": _adam_loss(rank, world), "initial": _evaluation_loss(_model())}
    for name, options in CONVERGENCE_CONFIGS.items():
        model = _model()
        optimizer = _build(name, model, **options)
        _train(model, optimizer, rank, range(1, CONVERGENCE_STEPS + 1))
        results[name] = _evaluation_loss(model)
        results[f"{name}/bytes"] = optimizer.bytes_on_wire
    return results


def _three_ranks(rank: int, world: int) -> dict:
    return {
        "checkpoints": {case: _round_trip(*case, rank) for case in CHECKPOINTS},
        "convergence": _convergence(rank, world),
    }


# ----------------------------------------------------------------------------------------------- tests


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models: more intra-op threads only fight over the shared cores (the workers use one each too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_workers(_two_ranks, 2)


@pytest.fixture(scope="module")
def three_ranks() -> list[dict]:
    return run_workers(_three_ranks, 3)


def test_warmup_equals_torch_adam_and_a_lamb_reference(two_ranks: list[dict]) -> None:
    for result in two_ranks:
        assert result["warmup"].keys() == {
            "onebit_adam/Adam",
            "onebit_adam/AdamW",
            "zeroone_adam/Adam",
            "onebit_lamb/LAMB",
            "onebit_lamb/coefficients",
        }
        assert max(result["warmup"].values()) < 1e-6, result["warmup"]


def test_first_compressed_step_is_the_compressed_average_of_the_preconditioned_momentum(two_ranks: list[dict]) -> None:
    for result in two_ranks:
        assert result["first_compressed"]["difference"] < 1e-6
        # Input 0 is always zero: its weights have v = 0 and the momentum mask must keep them still.
        assert result["first_compressed"]["dead_weights_moved"] == 0.0


def test_params_stay_identical_across_ranks_after_the_freeze(two_ranks: list[dict]) -> None:
    first, second = (r["trajectories"] for r in two_ranks)
    for name in ("onebit_adam", "onebit_lamb"):
        assert all(torch.equal(a, b) for a, b in zip(first[name], second[name], strict=True)), name
    zeroone = ZeroOneAdam(_model().parameters(), **CONFIGS["zeroone_adam"][1])
    for step, (a, b) in enumerate(zip(first["zeroone_adam"], second["zeroone_adam"], strict=True), start=1):
        if step <= zeroone.var_freeze_step or zeroone.synchronises(step):
            assert torch.equal(a, b), step
        else:  # phase B between synchronisations: each rank moves on its own gradient
            assert not torch.equal(a, b), step


def test_a_nonfinite_gradient_on_one_rank_skips_the_step_on_every_rank(two_ranks: list[dict]) -> None:
    first, second = (r["nonfinite"]["onebit_adam"] for r in two_ranks)
    assert [count for count, _ in first] == [0, 1, 2, 2, *range(3, 13)]
    assert torch.equal(first[0][1], _flat(_model()))  # call 1 (warm-up) changed nothing
    assert torch.equal(first[3][1], first[2][1])  # call 4 (compressed) changed nothing
    for (_, a), (_, b) in zip(first, second, strict=True):
        assert torch.equal(a, b)
        assert torch.isfinite(a).all()  # the error-feedback buffers were not poisoned


def test_a_nonfinite_local_step_is_dropped_and_the_ranks_still_meet(two_ranks: list[dict]) -> None:
    first, second = (r["nonfinite"]["zeroone_adam"] for r in two_ranks)
    assert [count for count, _ in first] == list(range(1, 15))
    for step in (12, 14):  # the synchronisations after the poisoned local step 11
        assert torch.equal(first[step - 1][1], second[step - 1][1])
        assert torch.isfinite(first[step - 1][1]).all()


def test_tiny_frozen_variances_blow_up_momentum_compression_but_not_ours(two_ranks: list[dict]) -> None:
    for result in (r["tiny_variance"] for r in two_ranks):
        variance = result["variance"]
        assert variance[variance > 0].min() < 1e-6 * variance.mean()  # tiny variances that the v = 0 mask misses
        # The paper's arithmetic: a 1-bit momentum of ±scale over a tiny √v moves an entry by thousands of lr
        # (measured: 117 with lr 0.01).
        assert max(result["plain"]["jumps"][CELLS_FREEZE:]) > 1000 * LR
        # Ours compresses m/(√v̂+ε): the 1-bit error is a few Adam steps at most (measured: 8 lr).
        assert max(result["onebit_adam"]["jumps"]) < 20 * LR
        for name in ("onebit_adam", "onebit_lamb", "zeroone_adam"):
            assert result[name]["loss"] < 1.25 * result["adam"]["loss"], (name, result[name]["loss"])


def test_ddp_with_the_comm_hook_equals_the_optimizer_alone(two_ranks: list[dict]) -> None:
    for result in two_ranks:
        assert max(result["ddp"].values()) < 1e-6, result["ddp"]


def test_the_overlap_hook_averages_each_bucket_in_one_bit_during_backward(two_ranks: list[dict]) -> None:
    first, second = (result["overlapped"] for result in two_ranks)
    assert len(first["buckets"]) == 4 and first["buckets"] == second["buckets"]  # one per parameter, same order
    assert first["difference"] < 1e-6 and second["difference"] < 1e-6
    # Every compressed byte went through the hooks' own allreduce.
    assert first["sent_outside_the_hooks"] == second["sent_outside_the_hooks"] == 0
    # Rank 1's non-finite gradients at step 7 made both ranks skip it.
    assert first["step_counts"] == second["step_counts"] == [5, 6, 6, 7, 8]
    assert torch.equal(first["params"], second["params"])
    assert first["loss"] < 1.25 * first["adam_loss"], (first["loss"], first["adam_loss"])
    # Accumulation under no_sync() steps; a second synchronising backward pass before step() is refused.
    for accumulation in (first["accumulation"], second["accumulation"]):
        assert accumulation["steps"] == 1
        assert "was averaged twice before optimizer.step()" in accumulation["error"], accumulation["error"]
        assert "ddp_model.no_sync()" in accumulation["error"]
    # DDP's own collectives beside the hook's (find_unused_parameters) neither hang nor mix up the ranks' data.
    assert first["with_unused"]["steps"] == second["with_unused"]["steps"] == 12
    assert torch.equal(first["with_unused"]["params"], second["with_unused"]["params"])


@pytest.mark.parametrize("case", CHECKPOINTS, ids=[f"{name}-after-{step}" for name, step in CHECKPOINTS])
def test_checkpoint_round_trip_resumes_exactly(three_ranks: list[dict], case: tuple[str, int]) -> None:
    for result in three_ranks:
        assert result["checkpoints"][case]["restored_step"] == case[1]
        assert torch.equal(result["checkpoints"][case]["straight"], result["checkpoints"][case]["resumed"])


@pytest.mark.parametrize("name", list(CONVERGENCE_CONFIGS))
def test_converges_near_adam(three_ranks: list[dict], name: str) -> None:
    numel = sum(p.numel() for p in _model().parameters())
    fp32_allreduce_bytes = CONVERGENCE_STEPS * 2 * 2 * numel * 4 // 3  # ring allreduce, 3 ranks
    for result in (r["convergence"] for r in three_ranks):
        assert result["adam"] < 0.5 * result["initial"]
        assert result[name] <= 1.15 * result["adam"], (name, result[name], result["adam"])
        assert result[f"{name}/bytes"] < fp32_allreduce_bytes / 2


# ------------------------------------------------------------------------------------- one process


def test_world_size_one_needs_no_process_group_and_is_adam_with_a_frozen_variance() -> None:
    assert not dist.is_initialized()
    model, reference = _model(), _model()
    optimizer = OnebitAdam(model.parameters(), lr=LR, freeze_step=3)
    adam = torch.optim.Adam(reference.parameters(), lr=LR)
    for step in range(1, 7):
        _train(model, optimizer, 0, range(step, step + 1))
        _backward(reference, 0, step)
        if step <= 3:
            adam.step()
            continue
        with torch.no_grad():
            for p in reference.parameters():
                m, v = adam.state[p]["exp_avg"], adam.state[p]["exp_avg_sq"]
                m.lerp_(p.grad, 0.1)
                p -= LR / (1 - 0.9**step) * m / (v.sqrt() / math.sqrt(1 - 0.999**3) + 1e-8)
        assert torch.allclose(_flat(model), _flat(reference), atol=1e-6), step
    assert optimizer.world_size == 1
    assert optimizer.bytes_on_wire == 0


def test_world_size_one_onebit_lamb_is_lamb_then_the_frozen_coefficient_formula() -> None:
    model, reference, state = _model(), _model(), {}
    optimizer = OnebitLamb(model.parameters(), lr=LR, weight_decay=0.01, freeze_step=3)
    for step in range(1, 13):
        _train(model, optimizer, 0, range(step, step + 1))
        _backward(reference, 0, step)
        if step <= 3:
            _lamb_reference(reference, state, step, LR, 0.01)
        else:
            _lamb_compressed_reference(reference, state, step, 3, LR, 0.01)
        assert torch.allclose(_flat(model), _flat(reference), atol=1e-6), step
    factors = [optimizer.state[p]["factor"] for p in model.parameters()]
    assert factors == pytest.approx([state[i]["factor"] for i in range(len(factors))])
    assert any(f != 1.0 for f in factors)  # the fresh variance did move the factors


def test_world_size_one_zeroone_adam_phase_a_refreshes_the_variance_on_its_schedule() -> None:
    """Adam whose variance moves only at refresh steps: the cached denominators must follow each refresh."""
    model, reference, state = _model(), _model(), {}
    optimizer = ZeroOneAdam(model.parameters(), lr=LR, var_freeze_step=12, var_update_scaler=2)
    for step in range(1, 13):
        _train(model, optimizer, 0, range(step, step + 1))
        _backward(reference, 0, step)
        count = optimizer.variance_updates(step)
        with torch.no_grad():
            for index, p in enumerate(reference.parameters()):
                s = state.setdefault(index, {"m": torch.zeros_like(p), "v": torch.zeros_like(p)})
                s["m"] = 0.9 * s["m"] + 0.1 * p.grad
                if optimizer.refreshes_variance(step):
                    s["v"] = 0.999 * s["v"] + 0.001 * p.grad**2
                p -= LR / (1 - 0.9**step) * s["m"] / ((s["v"] / (1 - 0.999**count)).sqrt() + 1e-8)
        assert torch.allclose(_flat(model), _flat(reference), atol=1e-6), step


@pytest.mark.parametrize("name", list(CONFIGS))
def test_world_size_one_trains_through_every_stage(name: str) -> None:
    model = _model()
    optimizer = _build(name, model)
    initial = _evaluation_loss(model)
    _train(model, optimizer, 0, range(1, 31))
    assert optimizer.step_count == 30
    assert _evaluation_loss(model) < 0.9 * initial


def test_zeroone_adam_schedules() -> None:
    optimizer = ZeroOneAdam(
        _model().parameters(), var_freeze_step=20, var_update_scaler=2, local_step_scaler=2, local_step_clipper=4
    )
    assert [s for s in range(1, 50) if optimizer.refreshes_variance(s)] == [1, 2, 4, 6, 10, 14]
    assert [optimizer.variance_updates(s) for s in (1, 3, 14, 15, 40)] == [1, 2, 6, 6, 6]
    assert [s for s in range(1, 50) if optimizer.synchronises(s)] == [21, 22, 24, 26, 30, 34, 38, 42, 46]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sparse_gradients_are_refused(name: str) -> None:
    embedding = nn.Embedding(10, 4, sparse=True)
    optimizer = CONFIGS[name][0](embedding.parameters())
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(FilterForwardError, match="sparse gradient"):
        optimizer.step()


@pytest.mark.parametrize(
    ("cls", "options", "message"),
    [
        (OnebitAdam, {"lr": -1.0}, "lr must be"),
        (OnebitAdam, {"betas": (0.9, 1.0)}, "betas must"),
        (OnebitAdam, {"freeze_step": 0}, "freeze_step must"),
        (ZeroOneAdam, {"eps": 0.0}, "eps must"),
        (ZeroOneAdam, {"local_step_clipper": 2.5}, "local_step_clipper must"),
        (OnebitLamb, {"min_coeff": 20.0}, "min_coeff"),
        (OnebitLamb, {"factor_min": 2.0}, "factor_min"),
        (OnebitLamb, {"factor_threshold": -0.1}, "factor_threshold"),
    ],
)
def test_bad_settings_are_refused(cls: type[CompressedOptimizer], options: dict, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message):
        cls(_model().parameters(), **options)


def test_the_trainer_refuses_a_diverged_mc() -> None:
    model = build_mc("full_frame", 8, (4, 6), 1)
    config = TrainConfig(event="car", architecture="full_frame", input_size=(192, 128), optimizer="onebit_adam")
    check_finite(model, config)  # a fresh MC passes
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.nan
    with pytest.raises(FilterForwardError, match=r"training diverged: 1 of .* NaN or inf .* onebit_adam"):
        check_finite(model, config)


def test_a_step_skipped_again_and_again_warns_at_the_1st_10th_100th_time(caplog: pytest.LogCaptureFixture) -> None:
    """A diverged run retries its skipped step on every batch: one warning per batch flooded the training output."""
    model = _model()
    optimizer = _build("onebit_adam", model)
    with caplog.at_level(logging.WARNING, logger="models.optimizers.base"):
        for call in range(1, 106):
            _backward(model, 0, call)
            model[2].bias.grad[0] = math.inf if call <= 101 else 0.0
            optimizer.step()
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [
        "OnebitAdam step 1 skipped on every rank: the averaged values are not finite",
        "OnebitAdam step 1 skipped on every rank (10 times in a row): the averaged values are not finite",
        "OnebitAdam step 1 skipped on every rank (100 times in a row): the averaged values are not finite",
    ]
    assert optimizer.step_count == 4  # steps go through again once the gradients are finite
