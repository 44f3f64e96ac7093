"""Stored H.264 fragments (common/fragment.py) made viewable: joined into one MP4 without re-encoding, and a
single frame decoded to JPEG.

Presentation times are the frames' stream times, so a clip of sparse matches shows each frame for as long
as it lasted on the camera. A reader starts at a GOP's first fragment: decoding needs its keyframe.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from fractions import Fraction

import av

from common.fragment import Fragment, FrameEntry
from models.errors import FilterForwardError

TIME_BASE = Fraction(1, 1000)  # presentation times in milliseconds
JPEG_QUALITY = 3  # FFmpeg's mjpeg qscale (2 best .. 31 worst): about OpenCV's quality 90


def _units(fragments: Sequence[Fragment]) -> Iterator[tuple[FrameEntry, bytes]]:
    if not fragments or not fragments[0].starts_gop:
        raise FilterForwardError("stored fragments must start at a keyframe: no clip or frame can be made from them")
    gop, part = fragments[0].header.gop, -1
    for fragment in fragments:
        header = fragment.header
        if fragment.starts_gop:
            gop = header.gop
        elif header.gop != gop:
            raise FilterForwardError(f"fragment of GOP {header.gop} stored without its keyframe")
        elif header.part is not None and header.part != part + 1:  # None: an edge that predates parts
            raise FilterForwardError(f"fragment part {header.part} of GOP {gop} stored without part {part + 1}")
        part = header.part if header.part is not None else part
        yield from zip(fragment.header.frames, fragment.units, strict=True)


def join_mp4(fragments: Sequence[Fragment]) -> bytes:
    """One MP4 (H.264 copied, not re-encoded) of fragments in stream order, the first starting a GOP."""
    first = fragments[0].header if fragments else None
    output = io.BytesIO()
    with av.open(output, "w", format="mp4") as container:
        stream = None
        start = last_pts = 0  # the first frame plays at 0
        for entry, unit in _units(fragments):
            if stream is None:
                stream = container.add_stream("h264", rate=Fraction(first.fps))
                stream.width, stream.height = first.width, first.height
                stream.time_base = TIME_BASE
                start, last_pts = round(entry.time / TIME_BASE), -1
            packet = av.Packet(unit)
            packet.stream, packet.time_base = stream, TIME_BASE
            last_pts = packet.pts = packet.dts = max(last_pts + 1, round(entry.time / TIME_BASE) - start)
            packet.is_keyframe = entry.keyframe
            container.mux(packet)
    return output.getvalue()


def frame_jpeg(fragments: Sequence[Fragment], index: int) -> bytes:
    """The camera frame `index` as JPEG, decoded from the start of its GOP (`fragments` up to the one holding
    it, the first starting the GOP)."""
    indices = [entry.index for fragment in fragments for entry in fragment.header.frames]
    if index not in indices:
        raise FilterForwardError(f"frame {index} is not in the stored fragments given")
    wanted = indices.index(index)  # its picture's number: decoding order is display order (no B-frames)
    decoder = av.CodecContext.create("h264", "r")
    decoded = 0
    for position, (_entry, unit) in enumerate(_units(fragments)):
        pictures = decoder.decode(av.Packet(unit))
        if position == wanted:
            pictures += decoder.decode(None)  # the decoder may hold pictures back until flushed
        for picture in pictures:
            if decoded == wanted:
                return _jpeg(picture)
            decoded += 1
        if position == wanted:
            break
    raise FilterForwardError(f"frame {index} did not decode from its stored fragments")


def _jpeg(picture: av.VideoFrame) -> bytes:
    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width, encoder.height = picture.width, picture.height
    encoder.pix_fmt = "yuvj420p"
    encoder.time_base = Fraction(1, 25)
    encoder.options = {"qscale": str(JPEG_QUALITY)}
    encoder.flags |= av.codec.context.Flags.qscale
    picture = picture.reformat(format="yuvj420p")
    packets = encoder.encode(picture) + encoder.encode(None)
    return b"".join(bytes(packet) for packet in packets)
