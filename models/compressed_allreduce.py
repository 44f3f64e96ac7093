"""Error-compensated 1-bit compressed averaging allreduce over torch.distributed (gloo or NCCL).

The arithmetic (1-bit Adam paper, Tang et al. 2021), for a flat vector of N elements on each of n ranks:

* Worker: x ← x + e_w; scale s_w = ‖x‖₂/√N; C(x) = s_w·sign(x) with sign(0) = +1; e_w ← x − C(x).
* Phase 1: the packed signs are cut into n chunks; rank r receives chunk r from every rank, with each
  sender's scale, in ONE ``all_to_all_single`` (gloo supports it on torch 2.13, checked by the tests).
* Server (rank r, its chunk): y = (1/n)·Σᵢ s_w,i·signᵢ + e_s; s_s = ‖y‖/√(chunk length); e_s ← y − s_s·sign(y).
* Phase 2: ONE ``all_gather_single`` of every server's packed signs + scale; every rank rebuilds the
  same averaged vector.

Padding: the vector is zero-padded to P, a multiple of 8·n, so every chunk is whole bytes. Padding
never enters the arithmetic: scales are RMS over the real elements only (worker: √N; server: √(real
elements in its chunk), the last chunks may be partly or wholly padding), the error buffers are zero
there, and the padded tail is dropped from the result. The padding signs still travel (they are in the
bytes); that is under 8·n bits, a few bytes per call.

Wire format: each message row is ``[packed signs | the fp32 scale as 4 bytes]`` (native byte order),
so a call is two collectives. Signs are packed 8 per byte, most significant bit first (element 8k is bit 7 of byte k).

Bytes on the wire (``bytes_on_wire``, per rank, what this rank SENDS): with L = P/n,
phase 1 sends its n−1 foreign rows, phase 2 sends its own row to n−1 peers (an all_gather moves each
rank's row to every other rank once, whether by ring or directly): 2·(n−1)·(L/8 + 4) bytes. The fp32
ring allreduce it replaces sends 2·(n−1)/n·4N bytes per rank, so the ratio is ≈ 1/32 for large N.
Collective headers are not counted; the tests compare the counter with the bytes the kernel saw written.

Error buffers are per ``name`` and persist across calls; they are never checkpointed.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from models.errors import FilterForwardError

logger = logging.getLogger(__name__)

_BITS = 8
_SCALE_BYTES = 4  # one fp32 scale appended to every message row
# Bit k of a byte (MSB first) holds element k of its group of 8.
_SHIFTS = torch.arange(_BITS - 1, -1, -1, dtype=torch.uint8)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Flat float tensor -> uint8, 8 signs per byte (bit 1 for x >= 0, so sign(0) = +1), MSB first."""
    if x.dim() != 1 or x.numel() % _BITS:
        raise ValueError(f"pack_signs needs a flat tensor whose length is a multiple of 8, got shape {tuple(x.shape)}")
    bits = (x >= 0).to(torch.uint8).view(-1, _BITS)
    return (bits << _SHIFTS.to(x.device)).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 from pack_signs -> float32 tensor of ±1 with the first n signs."""
    if packed.dtype != torch.uint8 or packed.dim() != 1 or not 0 <= n <= packed.numel() * _BITS:
        raise ValueError(
            f"unpack_signs needs flat uint8 holding at least {n} bits, got {packed.dtype} {tuple(packed.shape)}"
        )
    bits = (packed.unsqueeze(1) >> _SHIFTS.to(packed.device)) & 1
    return bits.reshape(-1)[:n].to(torch.float32) * 2 - 1


def padded_length(n_elements: int, world_size: int) -> int:
    """Smallest multiple of 8·world_size that holds n_elements (each rank's chunk is whole bytes)."""
    block = _BITS * world_size
    return -(-n_elements // block) * block


def _compress(y: torch.Tensor, valid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-bit compress y whose first `valid` elements are real: (packed signs, fp32 scale of shape (1,), error).

    The scale is the RMS of the real elements; the error is zero on the padding so it never accumulates there.
    """
    real = y[:valid]
    scale = (real.norm() / math.sqrt(valid)) if valid else y.new_zeros(())
    signs = torch.where(y >= 0, 1.0, -1.0)
    error = y - scale * signs
    error[valid:] = 0
    return pack_signs(y), scale.reshape(1), error


def _expand(packed: torch.Tensor, scales: torch.Tensor, length: int) -> torch.Tensor:
    """Rows of packed signs (k, length/8) and their scales (k,) -> the decompressed values, shape (k, length)."""
    signs = unpack_signs(packed.reshape(-1), packed.numel() * _BITS).view(packed.shape[0], length)
    return scales.unsqueeze(1) * signs


def _server_average(packed: torch.Tensor, scales: torch.Tensor, length: int) -> torch.Tensor:
    """The mean over ranks of their decompressed chunks: packed (n, length/8), scales (n,) -> (length,)."""
    return _expand(packed, scales, length).mean(dim=0)


def _valid_in_chunk(n_elements: int, chunk: int, rank: int) -> int:
    """How many real (non-padding) elements chunk `rank` of the padded vector holds."""
    return max(0, min(chunk, n_elements - rank * chunk))


def _to_rows(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Message rows [signs | fp32 scale bytes]: packed (k, b) uint8, scales (k,) fp32 -> (k, b + 4) uint8."""
    scale_bytes = scales.to(torch.float32).contiguous().view(torch.uint8).view(-1, _SCALE_BYTES)
    return torch.cat([packed, scale_bytes], dim=1)


def _from_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of _to_rows: (k, b + 4) uint8 -> packed (k, b), scales (k,) fp32."""
    scales = rows[:, -_SCALE_BYTES:].contiguous().view(torch.float32).reshape(-1)
    return rows[:, :-_SCALE_BYTES], scales


def check_compressible(tensor: torch.Tensor) -> None:
    """Raise FilterForwardError for tensors the 1-bit allreduce cannot carry."""
    if tensor.layout != torch.strided:
        raise FilterForwardError(
            f"compressed allreduce got a {tensor.layout} tensor: only dense tensors are supported, "
            "densify it (tensor.to_dense()) or turn off sparse gradients"
        )
    if not tensor.is_floating_point():
        raise FilterForwardError(
            f"compressed allreduce got dtype {tensor.dtype}: only float tensors (fp32, fp16, bf16) are supported"
        )


def dense_reference(
    tensors: list[torch.Tensor],
    worker_errors: list[torch.Tensor] | None = None,
    server_errors: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The same compression arithmetic in one process, for tests: one input tensor per rank.

    worker_errors: per rank, padded length P (None = zeros); server_errors: per rank, chunk length P/n.
    Returns (the averaged result every rank gets, shaped and typed like tensors[0], new worker errors,
    new server errors).
    """
    world = len(tensors)
    n_elements = tensors[0].numel()
    total = padded_length(n_elements, world)
    chunk = total // world
    worker_errors = worker_errors or [tensors[0].new_zeros(total, dtype=torch.float32)] * world
    server_errors = server_errors or [tensors[0].new_zeros(chunk, dtype=torch.float32)] * world

    compressed = [_compress(_padded(t, total) + e, n_elements) for t, e in zip(tensors, worker_errors, strict=True)]
    packed = torch.stack([c[0] for c in compressed]).view(world, world, chunk // _BITS)  # [sender, chunk]
    scales = torch.cat([c[1] for c in compressed])
    new_worker_errors = [c[2] for c in compressed]

    servers = [
        _compress(
            _server_average(packed[:, r], scales, chunk) + server_errors[r],
            _valid_in_chunk(n_elements, chunk, r),
        )
        for r in range(world)
    ]
    result = _expand(torch.stack([s[0] for s in servers]), torch.cat([s[1] for s in servers]), chunk)
    out = result.reshape(-1)[:n_elements].view(tensors[0].shape).to(tensors[0].dtype)
    return out, new_worker_errors, [s[2] for s in servers]


def _padded(tensor: torch.Tensor, total: int) -> torch.Tensor:
    """Flat fp32 copy of tensor, zero-padded to total elements."""
    flat = tensor.detach().reshape(-1).to(torch.float32)
    return torch.nn.functional.pad(flat, (0, total - flat.numel()))


@dataclass
class _ErrorBuffers:
    """Error feedback state of one named tensor: worker error (padded length) and server error (its chunk)."""

    numel: int
    worker: torch.Tensor
    server: torch.Tensor


class CompressedAllreduce:
    """Error-compensated 1-bit averaging allreduce over a process group (gloo or NCCL).

    Every rank must call allreduce with tensors of the same shape, in the same order. Without an
    initialised process group (or with one rank) it returns the input unchanged.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.bytes_on_wire = 0
        self._errors: dict[str, _ErrorBuffers] = {}

    @property
    def world_size(self) -> int:
        """Ranks in the group; 1 when torch.distributed is not initialised."""
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.group)

    @torch.no_grad()
    def allreduce(self, tensor: torch.Tensor, name: str = "default") -> torch.Tensor:
        """The decompressed average over ranks of tensor, same shape and dtype (computed in fp32).

        With world size 1 the input itself is returned (uncompressed, no copy).
        """
        check_compressible(tensor)
        world = self.world_size
        if world == 1 or tensor.numel() == 0:
            return tensor
        rank = dist.get_rank(self.group)
        n_elements = tensor.numel()
        total = padded_length(n_elements, world)
        chunk = total // world
        errors = self._buffers(name, tensor, total, chunk)

        # Worker: compress x + e_w and route chunk r of the signs (with our scale) to rank r.
        packed, scale, errors.worker = _compress(_padded(tensor, total) + errors.worker, n_elements)
        rows = _to_rows(packed.view(world, chunk // _BITS), scale.expand(world))
        received = torch.empty_like(rows)
        dist.all_to_all_single(received, rows, group=self.group)

        # Server: average our chunk over ranks, add the server error, re-compress.
        server_packed, server_scale, errors.server = _compress(
            _server_average(*_from_rows(received), chunk) + errors.server,
            _valid_in_chunk(n_elements, chunk, rank),
        )
        own_row = _to_rows(server_packed.unsqueeze(0), server_scale)
        gathered = own_row.new_empty((world, own_row.shape[1]))
        dist.all_gather_single(gathered, own_row, group=self.group)

        self.bytes_on_wire += 2 * (world - 1) * rows.shape[1]
        result = _expand(*_from_rows(gathered), chunk).reshape(-1)[:n_elements]
        return result.view(tensor.shape).to(tensor.dtype)

    def _buffers(self, name: str, tensor: torch.Tensor, total: int, chunk: int) -> _ErrorBuffers:
        """The error buffers of name, zeros on first use; a different element count under one name is an error."""
        if name not in self._errors:
            logger.debug("compressed allreduce %r: new error buffers for %d elements", name, tensor.numel())
            self._errors[name] = _ErrorBuffers(
                numel=tensor.numel(),
                worker=torch.zeros(total, dtype=torch.float32, device=tensor.device),
                server=torch.zeros(chunk, dtype=torch.float32, device=tensor.device),
            )
        errors = self._errors[name]
        if errors.numel != tensor.numel():
            raise FilterForwardError(
                f"compressed allreduce {name!r} holds error buffers for {errors.numel} elements, got "
                f"{tensor.numel()}: use one name per tensor or call reset_errors({name!r})"
            )
        return errors

    def reset_errors(self, name: str | None = None) -> None:
        """Drop the error buffers of name (all names when None); the next call starts from zero error."""
        if name is None:
            self._errors.clear()
        else:
            self._errors.pop(name, None)
