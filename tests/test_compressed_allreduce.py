"""The error-compensated 1-bit allreduce: packing, the arithmetic, and real gloo runs with 2, 3 and 4 ranks.

All distributed checks share ONE spawn of 4 gloo processes (spawning costs seconds): the 2- and 3-rank
cases run on subgroups of it, which also exercises the `group` argument.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from distributed import run_workers

from models.compressed_allreduce import (
    CompressedAllreduce,
    dense_reference,
    pack_signs,
    padded_length,
    unpack_signs,
)
from models.errors import FilterForwardError

WORLD_SIZES = (2, 3, 4)
# (name, shape, dtype): odd lengths exercise padding; "tiny" leaves whole chunks of padding at 4 ranks.
CASES = (
    ("odd", (1001,), torch.float32),
    ("matrix", (7, 5, 3), torch.float32),
    ("tiny", (10,), torch.float32),
    ("bf16", (64,), torch.bfloat16),
)
REFERENCE_STEPS = 3
FEEDBACK_STEPS = 200
FEEDBACK_CHECKPOINTS = (10, 50, 200)
BYTES_ELEMENTS = 1_000_000
PROC_IO = Path("/proc/self/io")


# ---------------------------------------------------------------- packing


def test_pack_unpack_round_trip_and_bit_order() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * 37, generator=generator)
    x[::5] = 0.0  # sign(0) = +1
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.numel() == 37
    expected = torch.where(x >= 0, 1.0, -1.0)
    assert torch.equal(unpack_signs(packed, x.numel()), expected)
    assert torch.equal(unpack_signs(packed, 13), expected[:13])
    # Most significant bit first: element 0 is bit 7.
    assert pack_signs(torch.tensor([1.0, -1, -1, -1, -1, -1, -1, 2])).item() == 0b1000_0001


def _reference_pack(x: torch.Tensor) -> list[int]:
    """Signs packed the plain way, one element at a time: bit 7 - j of byte k is x[8k + j] >= 0."""
    values = x.tolist()
    return [sum(int(values[8 * k + j] >= 0) << (7 - j) for j in range(8)) for k in range(len(values) // 8)]


@pytest.mark.parametrize("n", [1, 7, 8, 13, 8 * 37, 1001, 4099])
def test_vectorized_packing_equals_the_plain_reference_and_round_trips_odd_lengths(n: int) -> None:
    generator = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=generator)
    x[::7] = 0.0
    x[1::11] = -0.0  # a zero either way is sign +1
    x[2::13] = torch.tensor([math.inf, -math.inf, 1e-40, -1e-40]).repeat(n)[: x[2::13].numel()]
    padded = torch.nn.functional.pad(x, (0, padded_length(n, 1) - n))  # as the allreduce pads: zeros
    packed = pack_signs(padded)
    assert packed.tolist() == _reference_pack(padded)
    assert torch.equal(unpack_signs(packed, n), torch.where(x >= 0, 1.0, -1.0))


@pytest.mark.parametrize("bad", [torch.ones(12), torch.ones(2, 8)])
def test_pack_signs_needs_flat_multiple_of_8(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_signs(bad)


def test_unpack_signs_rejects_too_few_bits() -> None:
    with pytest.raises(ValueError, match="at least 17 bits"):
        unpack_signs(torch.zeros(2, dtype=torch.uint8), 17)


def test_padding_is_a_multiple_of_8_times_world() -> None:
    assert [padded_length(n, 3) for n in (1, 24, 25, 1001)] == [24, 24, 48, 1008]


# ---------------------------------------------------------------- arithmetic, one process


def _plain_step(
    inputs: list[torch.Tensor], worker_errors: list[torch.Tensor], server_errors: list[torch.Tensor]
) -> torch.Tensor:
    """REFERENCES.md's arithmetic written out plainly: no padding, no packing; updates the errors in place."""
    world, n = len(inputs), inputs[0].numel()
    chunk = padded_length(n, world) // world
    compressed = []
    for x, error in zip(inputs, worker_errors, strict=True):
        y = x.reshape(-1).float() + error
        c = y.norm() / math.sqrt(n) * torch.where(y >= 0, 1.0, -1.0)
        error.copy_(y - c)
        compressed.append(c)
    out = torch.empty(n)
    for r in range(world):
        part = slice(r * chunk, min((r + 1) * chunk, n))
        if part.start >= n:
            continue
        y = torch.stack([c[part] for c in compressed]).mean(0) + server_errors[r][: part.stop - part.start]
        out[part] = y.norm() / math.sqrt(y.numel()) * torch.where(y >= 0, 1.0, -1.0)
        server_errors[r][: y.numel()] = y - out[part]
    return out


@pytest.mark.parametrize(("world", "n"), [(3, 1001), (4, 10), (2, 64)])
def test_dense_reference_is_the_documented_arithmetic(world: int, n: int) -> None:
    generator = torch.Generator().manual_seed(world * n)
    chunk = padded_length(n, world) // world
    plain_worker = [torch.zeros(n) for _ in range(world)]
    plain_server = [torch.zeros(chunk) for _ in range(world)]
    worker_errors = server_errors = None
    for _ in range(4):
        inputs = [torch.randn(n, generator=generator) for _ in range(world)]
        result, worker_errors, server_errors = dense_reference(inputs, worker_errors, server_errors)
        assert torch.allclose(result, _plain_step(inputs, plain_worker, plain_server), atol=1e-6)
        # Padding never carries error.
        assert all(not e[n:].any() for e in worker_errors)
    assert torch.allclose(torch.stack(worker_errors)[:, :n], torch.stack(plain_worker), atol=1e-6)


# ---------------------------------------------------------------- world size 1 and bad input


def test_world_size_1_returns_the_input_uncompressed() -> None:
    x = torch.randn(100)
    reducer = CompressedAllreduce()
    assert reducer.world_size == 1 and reducer.allreduce(x) is x
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert reducer.world_size == 1 and reducer.allreduce(x, "again") is x
    finally:
        dist.destroy_process_group()
    assert reducer.bytes_on_wire == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (torch.arange(16), "only float tensors"),
        (torch.ones(4, dtype=torch.complex64), "only float tensors"),
        (torch.eye(4).to_sparse(), "only dense tensors"),
    ],
)
def test_bad_inputs_raise_one_line_errors(bad: torch.Tensor, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message) as info:
        CompressedAllreduce().allreduce(bad)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- real gloo processes


def _written_bytes() -> int:
    """Bytes this process has handed to write()/send() so far, socket traffic included (Linux)."""
    return next(int(line.split()[1]) for line in PROC_IO.read_text().splitlines() if line.startswith("wchar"))


def _matches_reference(rank: int, size: int, group: dist.ProcessGroup | None) -> dict[str, float]:
    """Max |allreduce − dense_reference| per case over a few steps (every rank builds all ranks' inputs)."""
    reducer = CompressedAllreduce(group)
    generator = torch.Generator().manual_seed(size)
    gaps = {}
    for name, shape, dtype in CASES:
        worker_errors = server_errors = None
        gap = 0.0
        for _ in range(REFERENCE_STEPS):
            inputs = [torch.randn(shape, generator=generator).to(dtype) for _ in range(size)]
            result = reducer.allreduce(inputs[rank], name)
            expected, worker_errors, server_errors = dense_reference(inputs, worker_errors, server_errors)
            assert result.shape == expected.shape and result.dtype == dtype
            gap = max(gap, (result.float() - expected.float()).abs().max().item())
        gaps[name] = gap
    return gaps


def _divided(rank: int, size: int, group: dist.ProcessGroup | None) -> dict[str, object]:
    """The optimizers' path: input_buffer + reduce with a divisor (fused into the error feedback) against
    dense_reference of x/d; then a non-finite input on rank 0 and a restart from zero error."""
    reducer = CompressedAllreduce(group)
    generator = torch.Generator().manual_seed(7 + size)
    divisor = torch.rand(1001, generator=generator) + 0.5
    worker_errors = server_errors = None
    gap, addresses = 0.0, set()
    for _ in range(REFERENCE_STEPS):
        inputs = [torch.randn(1001, generator=generator) for _ in range(size)]
        reducer.input_buffer("divided", 1001).copy_(inputs[rank])
        values, finite = reducer.reduce("divided", divisor)
        expected, worker_errors, server_errors = dense_reference(
            [x / divisor for x in inputs], worker_errors, server_errors
        )
        gap = max(gap, (values - expected).abs().max().item()) if finite else math.inf
        addresses.add(values.data_ptr())
    poisoned = reducer.input_buffer("divided", 1001)
    poisoned.fill_(1.0)
    poisoned[5] = math.inf if rank == 0 else 1.0
    nonfinite = reducer.reduce("divided", divisor).finite
    inputs = [torch.randn(1001, generator=generator) for _ in range(size)]
    reducer.input_buffer("divided", 1001).copy_(inputs[rank])
    values = reducer.reduce("divided", divisor).values
    restart_gap = (values - dense_reference([x / divisor for x in inputs])[0]).abs().max().item()
    return {"gap": gap, "buffers": len(addresses), "nonfinite": nonfinite, "restart_gap": restart_gap}


def _feedback_errors(rank: int, size: int, group: dist.ProcessGroup | None, feedback: bool) -> dict[int, float]:
    """Relative error of the running mean of compressed results vs the running mean of true averages."""
    reducer = CompressedAllreduce(group)
    generator = torch.Generator().manual_seed(100 + size)
    base = torch.randn(size, 4096, generator=generator)
    sum_compressed, sum_true, errors = torch.zeros(4096), torch.zeros(4096), {}
    for step in range(1, FEEDBACK_STEPS + 1):
        inputs = base + 0.5 * torch.randn(size, 4096, generator=generator)
        if not feedback:
            reducer.reset_errors()
        sum_compressed += reducer.allreduce(inputs[rank], "grad")
        sum_true += inputs.mean(0)
        if step in FEEDBACK_CHECKPOINTS:
            errors[step] = ((sum_compressed - sum_true).norm() / sum_true.norm()).item()
    return errors


def _bytes(rank: int, size: int, group: dist.ProcessGroup | None) -> dict[str, int]:
    """The counter and the bytes the kernel saw written, for a 1M-element fp32 tensor: compressed vs fp32."""
    reducer = CompressedAllreduce(group)
    x = torch.randn(BYTES_ELEMENTS, generator=torch.Generator().manual_seed(rank))
    dist.barrier(group)
    before = _written_bytes()
    reducer.allreduce(x, "big")
    compressed = _written_bytes() - before
    dist.barrier(group)
    before = _written_bytes()
    dist.all_reduce(x, group=group)
    return {"counter": reducer.bytes_on_wire, "compressed": compressed, "fp32": _written_bytes() - before}


def _name_reuse_error(rank: int, size: int, group: dist.ProcessGroup | None) -> str:
    reducer = CompressedAllreduce(group)
    reducer.allreduce(torch.ones(1001), "w")
    try:
        reducer.allreduce(torch.ones(50), "w")
    except FilterForwardError as exc:
        return str(exc)
    return "no error"


def _all_checks(rank: int, world_size: int) -> dict[int, dict[str, object]]:
    """Run every check for each world size on a subgroup of the ranks (the full group for the largest)."""
    results = {}
    for size in WORLD_SIZES:
        group = None if size == world_size else dist.new_group(list(range(size)))  # every rank must call it
        if rank >= size:
            continue
        results[size] = {
            "reference": _matches_reference(rank, size, group),
            "divided": _divided(rank, size, group),
            "feedback": _feedback_errors(rank, size, group, feedback=True),
            "no_feedback": _feedback_errors(rank, size, group, feedback=False),
            "bytes": _bytes(rank, size, group) if PROC_IO.exists() else None,
            "name_reuse": _name_reuse_error(rank, size, group),
        }
    return results


@pytest.fixture(scope="module")
def gloo_results() -> list[dict[int, dict[str, object]]]:
    return run_workers(_all_checks, max(WORLD_SIZES))


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_gloo_allreduce_matches_dense_reference(gloo_results: list, size: int) -> None:
    for rank in range(size):
        gaps = gloo_results[rank][size]["reference"]
        assert gaps.keys() == {name for name, _, _ in CASES}
        assert all(gap <= 1e-6 for gap in gaps.values()), (rank, gaps)


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_reduce_divides_in_the_error_feedback_pass_and_reuses_its_buffers(gloo_results: list, size: int) -> None:
    for rank in range(size):
        divided = gloo_results[rank][size]["divided"]
        assert divided["gap"] <= 1e-6, divided
        assert divided["buffers"] == 1  # every call wrote the same output buffer
        # A non-finite input on one rank is seen on every rank, and the next call starts from zero error.
        assert divided["nonfinite"] is False
        assert divided["restart_gap"] <= 1e-6, divided


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_error_feedback_keeps_the_running_mean_on_the_true_mean(gloo_results: list, size: int) -> None:
    feedback = gloo_results[0][size]["feedback"]
    no_feedback = gloo_results[0][size]["no_feedback"]
    # The accumulated error stays bounded, so the running mean's error shrinks like 1/steps ...
    assert feedback[200] < 0.05, feedback
    assert feedback[200] < feedback[50] < feedback[10] / 2, feedback
    assert feedback[200] < feedback[10] / 5, feedback
    # ... while without feedback the compression bias stays (so the check above can fail).
    assert no_feedback[200] > 10 * feedback[200], (feedback, no_feedback)


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_bytes_on_the_wire_are_under_a_twentieth_of_fp32(gloo_results: list, size: int) -> None:
    ring_fp32 = 2 * (size - 1) / size * 4 * BYTES_ELEMENTS
    for rank in range(size):
        measured = gloo_results[rank][size]["bytes"]
        if measured is None:
            pytest.skip("/proc/self/io is not available to measure socket bytes")
        assert measured["counter"] <= ring_fp32 / 20
        assert measured["compressed"] <= measured["fp32"] / 20, measured
        # The counter is honest: the kernel saw it written, plus only collective headers.
        assert measured["counter"] <= measured["compressed"] <= 1.01 * measured["counter"] + 4096, measured


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_reusing_a_name_for_another_size_raises(gloo_results: list, size: int) -> None:
    for rank in range(size):
        message = gloo_results[rank][size]["name_reuse"]
        assert "holds error buffers for 1001 elements, got 50" in message
