"""An event's MP4 clip made on demand from its stored JPEG frames (H.264, yuv420p, browser-playable).

Frames keep their stream times as presentation times, so a clip of sparse matches shows each frame for as
long as it lasted on the camera rather than as a fast-forward.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Iterator
from fractions import Fraction

import av

from common.video import even
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

TIME_BASE = Fraction(1, 1000)  # presentation times in milliseconds
MAX_FRAMES = 3000  # an on-demand encode stays a few seconds of CPU
# Larger frames are scaled down to fit: 20 frames of 8192x8192 took x264 past 1.6 GB (then a 500) in a probe.
MAX_SIDE = 1920


def encode_clip(frames: Iterable[tuple[float, bytes]]) -> bytes:
    """MP4 bytes of (stream time in seconds, JPEG) frames in stream order; frames that do not decode are skipped."""
    output = io.BytesIO()
    with av.open(output, "w", format="mp4") as container:
        stream = None
        last_pts = -1
        for time, frame in _decoded(frames):
            if stream is None:
                stream = container.add_stream("libx264", rate=30, options={"preset": "veryfast"})
                # the edge's size rule; reformat below stretches an odd side by its one pixel
                scale = min(1.0, MAX_SIDE / max(frame.width, frame.height))
                stream.width, stream.height = even(round(frame.width * scale)), even(round(frame.height * scale))
                stream.pix_fmt = "yuv420p"
                stream.codec_context.time_base = TIME_BASE
                start = time
            picture = frame.reformat(width=stream.width, height=stream.height, format="yuv420p")
            last_pts = picture.pts = max(last_pts + 1, round((time - start) / TIME_BASE))
            picture.time_base = TIME_BASE
            container.mux(stream.encode(picture))
        if stream is None:
            raise FilterForwardError("none of the event's stored frames is a readable JPEG: no clip can be made")
        container.mux(stream.encode(None))
    return output.getvalue()


def _decoded(frames: Iterable[tuple[float, bytes]]) -> Iterator[tuple[float, av.VideoFrame]]:
    decoder = av.CodecContext.create("mjpeg", "r")
    for count, (time, jpeg) in enumerate(frames):
        if count == MAX_FRAMES:
            log.info("clip cut at %d frames", MAX_FRAMES)
            return
        try:
            pictures = decoder.decode(av.Packet(jpeg))
        except av.FFmpegError as exc:
            log.warning("skipped a stored frame that is not a readable JPEG: %s", exc)
            continue
        for picture in pictures:
            yield time, picture
