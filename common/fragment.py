"""A fragment of a camera's matched-frame H.264 stream, as it travels from the edge to the cloud.

The edge encodes the frames its filters match, per camera, as one inter-frame-coded H.264 stream (Annex B,
parameter sets repeated at every keyframe) and cuts it into fragments of about a second. A fragment holds
whole access units in decoding order; it may depend on the earlier fragments of its GOP (`gop`, counted per
camera from the edge's start; `part`, its place in the GOP), never on another GOP. Its bytes are a 4-byte
big-endian header length, a UTF-8 JSON header (`FragmentHeader`) and the access units back to back, sized by the
header. With the camera's `upload: {crop: roi}` the pictures show only a part of the camera's frame (`crop`, fixed
for a GOP).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.errors import FilterForwardError, validation_summary

MAX_HEADER = 1 << 20  # a second of frames needs a few kB; anything larger is not a fragment
LENGTH = struct.Struct(">I")


class FragmentError(FilterForwardError):
    """Bytes that are not a well-formed fragment."""


class FrameEntry(BaseModel):
    """One access unit: the camera frame it encodes, its stream time, whether it starts a GOP, its size."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int = Field(ge=0, lt=2**63)
    time: float = Field(ge=0, le=1e9, allow_inf_nan=False)  # seconds on the camera's stream clock
    keyframe: bool
    size: int = Field(ge=1, lt=2**31)


class Crop(BaseModel):
    """The part of the camera's frame a GOP's pictures show, in the camera frame's pixels (before any upload
    scale): the box at (x, y), `width` x `height`, of a `frame_width` x `frame_height` frame."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)
    width: int = Field(ge=1, le=16384)
    height: int = Field(ge=1, le=16384)
    frame_width: int = Field(ge=1, le=16384)
    frame_height: int = Field(ge=1, le=16384)

    @model_validator(mode="after")
    def _inside(self) -> Crop:
        if self.x + self.width > self.frame_width or self.y + self.height > self.frame_height:
            raise ValueError(f"crop {self.describe()} does not fit its frame")
        return self

    def describe(self) -> str:
        return f"{self.width}x{self.height} at ({self.x}, {self.y}) of {self.frame_width}x{self.frame_height}"


class FragmentHeader(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gop: int = Field(ge=0, lt=2**63)
    # 0 for the GOP's first fragment (its keyframe), then 1, 2...: a receiver can tell a lost fragment of the GOP
    # (without the ones before it, a fragment does not decode). None from edges that predate it.
    part: int | None = Field(None, ge=0, lt=2**31)
    width: int = Field(ge=2, le=16384, multiple_of=2)
    height: int = Field(ge=2, le=16384, multiple_of=2)
    fps: str = Field(pattern=r"^[1-9][0-9]{0,5}/[1-9][0-9]{0,4}$")  # the encoder's frame rate, exact
    frames: list[FrameEntry] = Field(min_length=1, max_length=100_000)
    crop: Crop | None = None  # None: the whole frame

    @model_validator(mode="after")
    def _in_stream_order(self) -> FragmentHeader:
        indices = [frame.index for frame in self.frames]
        if indices != sorted(set(indices)):
            raise ValueError("frame indices must increase")
        return self


@dataclass(frozen=True)
class Fragment:
    header: FragmentHeader
    units: tuple[bytes, ...]  # one access unit per header frame

    @property
    def fps(self) -> Fraction:
        return Fraction(self.header.fps)

    @property
    def starts_gop(self) -> bool:
        return self.header.frames[0].keyframe

    @cached_property
    def packed(self) -> bytes:
        """Its wire bytes, made once: the pipeline counts them and the uplink sends them."""
        header = self.header.model_dump_json(exclude_none=True).encode()  # no crop: as before crops existed
        return LENGTH.pack(len(header)) + header + b"".join(self.units)


def pack(fragment: Fragment) -> bytes:
    return fragment.packed


def unpack(data: bytes) -> Fragment:
    """The fragment in `data`; FragmentError says what is wrong with bytes that are not one."""
    if len(data) < LENGTH.size:
        raise FragmentError(f"a fragment needs at least {LENGTH.size} bytes, got {len(data)}")
    (length,) = LENGTH.unpack_from(data)
    if not 0 < length <= min(MAX_HEADER, len(data) - LENGTH.size):
        raise FragmentError(f"fragment header length {length} does not fit the {len(data)} bytes received")
    try:
        header = FragmentHeader.model_validate(json.loads(data[LENGTH.size : LENGTH.size + length]))
    except (ValueError, UnicodeDecodeError) as exc:
        detail = validation_summary(exc) if isinstance(exc, ValidationError) else str(exc)
        raise FragmentError(f"fragment header is invalid: {detail}") from None
    except RecursionError:
        raise FragmentError("fragment header is invalid: JSON nested too deeply") from None
    body = memoryview(data)[LENGTH.size + length :]
    if sum(frame.size for frame in header.frames) != len(body):
        raise FragmentError(f"fragment header sizes add up to a different length than its {len(body)} bytes")
    units, offset = [], 0
    for frame in header.frames:
        units.append(bytes(body[offset : offset + frame.size]))
        offset += frame.size
    return Fragment(header, tuple(units))
