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
from typing import NamedTuple

import torch
import torch.distributed as dist

from models.errors import FilterForwardError

logger = logging.getLogger(__name__)

_BITS = 8
_SCALE_BYTES = 4  # one fp32 scale appended to every message row
# Bit k of a byte (MSB first) holds element k of its group of 8.
_SHIFTS = torch.arange(_BITS - 1, -1, -1, dtype=torch.uint8)
# Row b: the 8 signs (±1.0) that byte b unpacks to; scaled by s it decompresses a byte in one lookup.
_SIGN_TABLE = ((torch.arange(256, dtype=torch.uint8).unsqueeze(1) >> _SHIFTS) & 1).to(torch.float32) * 2 - 1


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Flat float tensor -> uint8, 8 signs per byte (bit 1 for x >= 0, so sign(0) = +1), MSB first."""
    if x.dim() != 1 or x.numel() % _BITS:
        raise ValueError(f"pack_signs needs a flat tensor whose length is a multiple of 8, got shape {tuple(x.shape)}")
    return _pack_signs_into(x).to(torch.uint8)


def _pack_signs_into(
    x: torch.Tensor, out: torch.Tensor | None = None, work: torch.Tensor | None = None
) -> torch.Tensor:
    """Flat float tensor (8k elements) -> its k packed sign bytes, MSB first (into out when given).

    work: optional int64 workspace of at least 2k elements. Returns the packed bytes as int64 (a view of
    the workspace), the index type that decompressing them with index_select wants.
    """
    # Each group of 8 sign bools is written straight into the bytes of one little-endian int64 (bool k =
    # bit 8k). Three shift-or steps move bit 8k to bit 63 - k, so the top byte is the packed group: a few
    # integer ops per 8 elements, no Python per element, and no fresh big buffer (a fresh 100 MB buffer
    # costs 5x the arithmetic that fills it in page faults).
    groups = x.numel() // _BITS
    work = x.new_empty(2 * groups, dtype=torch.int64) if work is None else work
    words, shifted = work[:groups], work[groups : 2 * groups]
    torch.ge(x, 0, out=words.view(torch.bool))
    for shift in (9, 18, 36):
        words |= torch.bitwise_left_shift(words, shift, out=shifted)
    words >>= 56
    words &= 0xFF  # the shift is arithmetic: drop the sign it copied down
    if out is not None:
        out.copy_(words.view(out.shape))
    return words


def unpack_signs(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 from pack_signs -> float32 tensor of ±1 with the first n signs."""
    if packed.dtype != torch.uint8 or packed.dim() != 1 or not 0 <= n <= packed.numel() * _BITS:
        raise ValueError(
            f"unpack_signs needs flat uint8 holding at least {n} bits, got {packed.dtype} {tuple(packed.shape)}"
        )
    return _SIGN_TABLE.to(packed.device)[packed.long()].reshape(-1)[:n]


def _decompress(indices: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Flat packed signs (k bytes as int64 or int32) and a 0-dim scale -> scale·sign written into out (8k elements)."""
    table = scale * _SIGN_TABLE.to(indices.device)  # scale·(±1) is exactly ±scale, as in the dense arithmetic
    torch.index_select(table, 0, indices, out=out.view(-1, _BITS))
    return out


def padded_length(n_elements: int, world_size: int) -> int:
    """Smallest multiple of 8·world_size that holds n_elements (each rank's chunk is whole bytes)."""
    block = _BITS * world_size
    return -(-n_elements // block) * block


def _compress(
    y: torch.Tensor,
    valid: int,
    packed: torch.Tensor | None = None,
    error: torch.Tensor | None = None,
    work: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-bit compress y whose first `valid` elements are real: (packed signs, fp32 scale of shape (1,), error).

    The scale is the RMS of the real elements; the error is zero on the padding so it never accumulates there.
    packed (y.numel()/8 bytes, any shape), error (like y, not y itself) and the int64 workspace (2·y.numel()/8)
    are filled when given, so a call allocates nothing of y's size.
    """
    real = y[:valid]
    scale = (real.norm() / math.sqrt(valid)) if valid else y.new_zeros(())
    indices = _pack_signs_into(y, packed, work)
    packed = indices.to(torch.uint8) if packed is None else packed
    error = _decompress(indices, scale, torch.empty_like(y) if error is None else error)
    torch.sub(y, error, out=error)
    error[valid:] = 0
    return packed, scale.reshape(1), error


def _expand(
    packed: torch.Tensor,
    scales: torch.Tensor,
    length: int,
    out: torch.Tensor | None = None,
    work: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows of packed signs (k, length/8) and their scales (k,) -> the decompressed values, shape (k, length).

    work: optional int64 workspace of k·length/8 elements for the byte indices.
    """
    out = packed.new_empty((packed.shape[0], length), dtype=torch.float32) if out is None else out
    indices = packed.int() if work is None else work[: packed.numel()].view(packed.shape).copy_(packed)
    for row_indices, scale, row_out in zip(indices, scales, out, strict=True):
        _decompress(row_indices, scale, row_out)
    return out


def _server_average(
    packed: torch.Tensor,
    scales: torch.Tensor,
    length: int,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    work: torch.Tensor | None = None,
) -> torch.Tensor:
    """The mean over ranks of their decompressed chunks: packed (n, length/8), scales (n,) -> (length,).

    scratch (n·length fp32) holds the decompressed chunks and work (int64, n·length/8) their byte
    indices; both optional.
    """
    decoded = _expand(packed, scales, length, None if scratch is None else scratch.view(-1, length), work)
    return torch.mean(decoded, dim=0, out=out)


def _valid_in_chunk(n_elements: int, chunk: int, rank: int) -> int:
    """How many real (non-padding) elements chunk `rank` of the padded vector holds."""
    return max(0, min(chunk, n_elements - rank * chunk))


def _set_scales(rows: torch.Tensor, scale: torch.Tensor) -> None:
    """Write the fp32 scale (shape (1,)) as the last 4 bytes of every message row (k, b + 4) uint8."""
    rows[:, -_SCALE_BYTES:] = scale.to(torch.float32).view(torch.uint8)


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


class Reduced(NamedTuple):
    """What CompressedAllreduce.reduce returns: the averaged values (a view of a buffer the next call of the
    same name overwrites) and whether they are all finite (every rank gets the same answer)."""

    values: torch.Tensor
    finite: bool


@dataclass
class _ErrorBuffers:
    """State of one named vector: its error feedback and the workspaces its calls reuse.

    worker: worker error (padded length); server: server error (its chunk); the rest are scratch
    buffers kept between calls so that a call allocates nothing of the vector's size (with one rank
    only `padded` exists: there is nothing to compress).
    """

    numel: int
    worker: torch.Tensor
    server: torch.Tensor
    padded: torch.Tensor  # the input (x, then x + e_w), fp32, padded length; then the server's decode scratch
    result: torch.Tensor  # the decompressed average, padded length
    work: torch.Tensor  # int64 indices and shift workspace, 2·P/8
    rows: torch.Tensor  # phase 1 message rows (n, L/8 + 4) uint8
    received: torch.Tensor  # phase 1 rows received, same shape
    average: torch.Tensor  # server: mean of the received chunks + e_s, length L
    own_row: torch.Tensor  # phase 2 message row (1, L/8 + 4) uint8
    gathered: torch.Tensor  # phase 2 rows of all servers (n, L/8 + 4) uint8

    @classmethod
    def zeros(cls, numel: int, world: int, chunk: int, device: torch.device) -> _ErrorBuffers:
        """Zero errors and fresh workspaces for numel elements over world ranks (chunk = padded length / world)."""
        total = world * chunk
        if world == 1:
            total = chunk = 0
        row_bytes = chunk // _BITS + _SCALE_BYTES
        rows = torch.empty((world, row_bytes), dtype=torch.uint8, device=device)
        return cls(
            numel=numel,
            worker=torch.zeros(total, dtype=torch.float32, device=device),
            server=torch.zeros(chunk, dtype=torch.float32, device=device),
            padded=torch.zeros(max(total, numel), dtype=torch.float32, device=device),
            result=torch.empty(total, dtype=torch.float32, device=device),
            work=torch.empty(2 * total // _BITS, dtype=torch.int64, device=device),
            rows=rows,
            received=torch.empty_like(rows),
            average=torch.empty(chunk, dtype=torch.float32, device=device),
            own_row=rows.new_empty((1, row_bytes)),
            gathered=torch.empty_like(rows),
        )


class CompressedAllreduce:
    """Error-compensated 1-bit averaging allreduce over a process group (gloo or NCCL).

    Every rank must call allreduce (or input_buffer + reduce) with vectors of the same length, in the same
    order. Without an initialised process group (or with one rank) nothing is compressed.
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
        """The decompressed average over ranks of tensor, a new tensor of the same shape and dtype (computed in fp32).

        With world size 1 the input itself is returned (uncompressed, no copy).
        """
        check_compressible(tensor)
        if self.world_size == 1 or tensor.numel() == 0:
            return tensor
        self.input_buffer(name, tensor.numel(), tensor.device).copy_(tensor.reshape(-1))
        return self.reduce(name).values.view(tensor.shape).to(tensor.dtype, copy=True)

    def input_buffer(self, name: str, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The flat fp32 buffer of numel elements that reduce(name) averages: fill it, then call reduce.

        Writing the vector here (torch ops with out=) saves the copy, and the fresh buffer, of a flat input.
        """
        return self._buffers(name, numel, torch.device(device)).padded[:numel]

    @torch.no_grad()
    def reduce(
        self, name: str, divisor: torch.Tensor | None = None, limits: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> Reduced:
        """The compressed average over ranks of input_buffer(name) (divided elementwise by divisor first, in
        the same pass that adds the error feedback, and clamped elementwise to limits = (low, high) after the
        division, the bounds made once by the caller rather than negated on every call: the
        one scale all signs share is then not set by a few huge entries). The values are a view valid until the
        next reduce(name).

        With one rank: the input (divided, not clamped: nothing shares a scale) itself. A non-finite average
        drops the error buffers of name; an infinite input still makes it non-finite, clamped or not.
        """
        errors = self._errors[name]
        n_elements = errors.numel
        x = errors.padded
        world = self.world_size
        if world == 1:
            values = x[:n_elements] if divisor is None else x[:n_elements].div_(divisor.reshape(-1))
            return Reduced(values, _all_finite(values))
        rank = dist.get_rank(self.group)
        chunk = errors.average.numel()
        x[n_elements:].zero_()  # the previous call used x as scratch
        real = x[:n_elements]  # the padding stays 0 (its error is always 0)
        if limits is None and divisor is not None:  # x/d + e_w in one pass
            torch.addcdiv(errors.worker[:n_elements], real, divisor.reshape(-1), out=real)
        else:  # the clamp comes between the division and the error feedback
            if divisor is not None:
                real.div_(divisor.reshape(-1))
            if limits is not None:
                if not _all_finite(real):
                    real.fill_(math.nan)  # the clamp would make an inf finite: the average must still say it
                torch.clamp(real, *limits, out=real)
            real.add_(errors.worker[:n_elements])

        # Worker: compress x + e_w and route chunk r of the signs (with our scale) to rank r.
        _, scale, _ = _compress(x, n_elements, errors.rows[:, :-_SCALE_BYTES], errors.worker, errors.work)
        _set_scales(errors.rows, scale)
        dist.all_to_all_single(errors.received, errors.rows, group=self.group)

        # Server: average our chunk over ranks, add the server error, re-compress.
        average = _server_average(*_from_rows(errors.received), chunk, errors.average, scratch=x, work=errors.work)
        average.add_(errors.server)
        _, server_scale, _ = _compress(
            average,
            _valid_in_chunk(n_elements, chunk, rank),
            errors.own_row[:, :-_SCALE_BYTES],
            errors.server,
            errors.work,
        )
        _set_scales(errors.own_row, server_scale)
        dist.all_gather_single(errors.gathered, errors.own_row, group=self.group)

        self.bytes_on_wire += 2 * (world - 1) * errors.rows.shape[1]
        packed, scales = _from_rows(errors.gathered)
        values = _expand(packed, scales, chunk, errors.result.view(world, chunk), errors.work).view(-1)[:n_elements]
        # Every value is ±(its chunk's scale): they are finite exactly when the scales of the chunks holding
        # real elements are (a non-finite input on any rank makes them inf or NaN).
        holding = -(-n_elements // chunk)
        finite = bool(torch.isfinite(scales[:holding]).all())
        if not finite:
            self.reset_errors(name)
        return Reduced(values, finite)

    def _buffers(self, name: str, numel: int, device: torch.device) -> _ErrorBuffers:
        """The buffers of name, zero errors on first use; a different element count under one name is an error."""
        if name not in self._errors:
            logger.debug("compressed allreduce %r: new error buffers for %d elements", name, numel)
            world = self.world_size
            chunk = padded_length(numel, world) // world
            self._errors[name] = _ErrorBuffers.zeros(numel, world, chunk, device)
        errors = self._errors[name]
        if errors.numel != numel:
            raise FilterForwardError(
                f"compressed allreduce {name!r} holds error buffers for {errors.numel} elements, got "
                f"{numel}: use one name per tensor or call reset_errors({name!r})"
            )
        return errors

    def reset_errors(self, name: str | None = None) -> None:
        """Drop the error buffers of name (all names when None); the next call starts from zero error."""
        if name is None:
            self._errors.clear()
        else:
            self._errors.pop(name, None)


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether no element is inf or NaN (min/max propagate both; one pass)."""
    return tensor.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(tensor))).all())
