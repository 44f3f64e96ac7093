"""The edge data path for one camera: frame -> base DNN taps -> MC bank -> smoothers -> encoder -> sink.

Matched frames leave per their filters' encoding: in the camera's H.264 stream (the default; one StreamEncoder
per camera, a keyframe at every stream filter's event start, fragments as they close), as a JPEG each, or in a
clip per event. A frame's image leaves once however many filters match it: in the stream if a stream filter
matches it first (or together with a JPEG filter), else as a JPEG; a later match of the same frame (another
filter's back-dated start) travels as metadata only, and the cloud points it at the image it already has.
Event clips are the exception: each holds its event's frames.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

import cv2
import numpy as np

from common.fragment import Crop, Fragment, pack
from edge.change_gate import ChangeGate
from edge.config import GateSettings, UploadSettings
from edge.encoder import ClipEncoder, encode_jpeg
from edge.encoding_thread import EncodingThread
from edge.mcbank import CameraState, LoadedMC, MCBank
from edge.sink import MatchedFrame, Sink
from edge.sources import Frame
from edge.stream_encoder import StreamEncoder, roi_crop
from models.basednn import BaseDNN
from models.filterspec import MAX_MOTION_FRAMES, FilterSpec
from models.motion import ForegroundMeter
from models.smoother import Event, Smoother

log = logging.getLogger(__name__)
# The rate given to the encoders of a live camera that reports none until it is measured (edge.sources):
# presentation times come from the frames' stream times, so it only sets x264's rate control and the slack of the
# keyframe and fragment timers.
UNKNOWN_FPS = 25.0


@dataclass
class StageStats:
    """Counters of one camera's pipeline since `started`."""

    frames: int = 0
    matched: int = 0
    bytes_out: int = 0
    skipped: int = 0  # frames the change gate found unchanged: the last processed frame's scores stood for them
    base_seconds: float = 0.0
    mc_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def summary(self, dropped: int, capped: int) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        frames = max(self.frames, 1)
        return {
            "fps": self.frames / elapsed,
            "base_ms": 1000 * self.base_seconds / frames,
            "mc_ms": 1000 * self.mc_seconds / frames,
            "frames": self.frames,
            "matched": self.matched,
            "skipped": self.skipped,
            "bytes_out": self.bytes_out,
            "dropped": dropped,
            "capped": capped,
        }


@dataclass
class _Recent:
    """A frame of the pre-roll buffer and its MC scores."""

    frame: Frame
    scores: dict[str, float]
    processed: float = field(default_factory=time.time)  # unix time
    matched: bool = False  # some filter matched it (counted once, however many messages it goes in)
    sent_quality: int = 0  # JPEG quality already sent for this frame (0: none)
    streamed: bool = False  # it went in the camera's stream

    @property
    def sent(self) -> bool:
        return self.streamed or self.sent_quality > 0

    def jpeg_to_send(self, quality: int) -> bytes:
        """The frame as JPEG, or b"" when its image already went out (in the stream, or as a JPEG at this
        quality or better): a later match of the same frame travels as metadata only."""
        if self.streamed or quality <= self.sent_quality:
            return b""
        self.sent_quality = quality
        return encode_jpeg(self.frame.image, quality)


@dataclass
class _Track:
    """A filter's smoother on this camera, and the clip being built for its open event (clip policy)."""

    spec: FilterSpec
    smoother: Smoother
    event_id: str | None = None  # the open event, if any
    clip: ClipEncoder | None = None
    motion: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_MOTION_FRAMES))  # region's, latest last


class CameraPipeline:
    """Runs every MC that applies to one camera on each of its frames and sends what they match."""

    def __init__(
        self,
        camera: str,
        base: BaseDNN,
        bank: MCBank,
        sink: Sink,
        fps: float | None,
        upload: UploadSettings | None = None,
        gate: GateSettings | None = None,
    ):
        self.camera = camera
        self.fps = fps  # of the source, for event clips and the stream; None: not known (yet)
        self.base = base
        self.bank = bank
        self.sink = sink
        self.upload = upload or UploadSettings()
        self.gate = _gate(gate)
        self._last_scores: dict[str, float] = {}  # of the last frame the base DNN ran on ...
        self._scored_by: frozenset[tuple[str, int]] = frozenset()  # ... and the filters (name, version) it ran
        self._stream: EncodingThread | None = None  # opened at the first stream filter's event
        self._stream_fps = 0.0  # the rate last given to the stream's encoder
        self._streamed = -1  # the last frame index in the stream: frames go in once, in order
        self.stats = StageStats()
        self.state = CameraState()
        self._tracks: dict[str, _Track] = {}
        # The last n frames and their scores: the pre-roll sent when an event start is back-dated.
        self._recent: deque[_Recent] = deque(maxlen=1)
        self._motion: ForegroundMeter | None = None  # the camera's background model, while a filter has a veto

    def process(self, frame: Frame) -> dict[str, bool]:
        """Handle one frame; returns, per active filter, whether this frame is positive."""
        mcs = self.bank.active(self.camera)
        self._sync_tracks(mcs)
        self.stats.frames += 1
        if not mcs:
            self._recent.append(_Recent(frame, {}))
            return {}
        # The gate compares the frame at the base DNN's input size: a thumbnail of a 1080p frame costs 5 ms more
        # than one of the resized frame, which the base DNN needs anyway.
        still = self._still_regions(frame, mcs)
        prepared = self.base.prepare(frame.image)
        scores = self._reused_scores(prepared, mcs)
        if scores is None:
            scores = self._score(prepared, mcs)
        self._recent.append(_Recent(frame, scores))
        return self._decide(frame, {name: 0.0 if name in still else score for name, score in scores.items()})

    def warm_up(self, images: Iterable[np.ndarray]) -> None:
        """Show the motion veto's background model frames from before the first one processed, as a live camera's
        has seen them (a replay of a clip's later part); nothing else sees them."""
        meter = self._meter([mc.spec for mc in self.bank.active(self.camera) if mc.spec.motion is not None])
        if meter is None:
            return
        for image in images:
            meter.foreground(image)

    def _meter(self, vetoes: list[FilterSpec]) -> ForegroundMeter | None:
        """The background model for these filters' regions; it starts afresh when one lies outside what it models,
        and is dropped while no filter has a veto."""
        if not vetoes:
            self._motion = None
            return None
        rois = frozenset(spec.roi for spec in vetoes)
        if self._motion is None or not rois <= self._motion.rois:
            self._motion = ForegroundMeter(rois)
        return self._motion

    def _still_regions(self, frame: Frame, mcs: tuple[LoadedMC, ...]) -> set[str]:
        """The filters with a motion veto (FilterSpec.motion) whose region has not moved enough lately: this frame
        does not count for them. The background model sees every frame, also those the change gate skips."""
        vetoes = [mc.spec for mc in mcs if mc.spec.motion is not None]
        meter = self._meter(vetoes)
        if meter is None:
            return set()
        foreground = meter.foreground(frame.image)
        still = set()
        for spec in vetoes:
            recent = self._tracks[spec.name].motion
            # Until the model has settled its fractions are unknown (NaN, as in training): they hold nothing back.
            recent.append(meter.fraction(foreground, spec.roi) if meter.settled else math.nan)
            if all(fraction < spec.motion.min_foreground for fraction in islice(reversed(recent), spec.motion.frames)):
                still.add(spec.name)
        return still

    def _reused_scores(self, prepared: np.ndarray, mcs: tuple[LoadedMC, ...]) -> dict[str, float] | None:
        """The last processed frame's scores when the change gate finds this frame unchanged inside the filters'
        regions; None when the base DNN must run (no gate, a change, or other filters than those scores'). A camera
        with a windowed filter runs it on every frame: such an MC reads the small changes from frame to frame that
        the gate ignores (skipping cost windowed filters 0.29 event F1 on bench/generalization.py's tud event)."""
        if self.gate is None or any(mc.history_shape is not None for mc in mcs):
            return None
        if _filters_of(mcs) != self._scored_by:
            self.gate.reset()
        if self.gate.must_process(prepared, [mc.spec.roi for mc in mcs]):
            return None
        self.stats.skipped += 1
        return dict(self._last_scores)

    def _score(self, prepared: np.ndarray, mcs: tuple[LoadedMC, ...]) -> dict[str, float]:
        """Every MC's score on this frame (at the base DNN's input size): the base DNN once, then the MC bank."""
        started = time.perf_counter()
        taps = self.base.run(prepared, self.bank.needed_taps(mcs))
        scored = time.perf_counter()
        scores = self.bank.score(mcs, taps, prepared, self.state)
        self.stats.base_seconds += scored - started
        self.stats.mc_seconds += time.perf_counter() - scored
        if self.gate is not None:  # what a frame the gate skips will reuse
            self._last_scores, self._scored_by = scores, _filters_of(mcs)
        return scores

    def _decide(self, frame: Frame, scores: dict[str, float]) -> dict[str, bool]:
        positives: dict[str, bool] = {}
        send: dict[int, list[str]] = {}
        for name, score in scores.items():
            track = self._tracks[name]
            decision = track.smoother.push(frame.index, frame.timestamp, score)
            positives[name] = decision.positive
            if decision.started:
                track.event_id = decision.started.id
                start = decision.started.start_frame
                log.info("camera %s: filter %s: event started at frame %d", self.camera, name, start)
                self.sink.event("start", decision.started)
                if track.spec.encoding.kind == "stream":
                    self._stream_encoder().submit(StreamEncoder.new_gop)
            for index in [*decision.backfill, *([frame.index] if decision.positive else [])]:
                send.setdefault(index, []).append(name)
            if decision.ended:
                self._end_event(track, decision.ended)
        for index, matched in sorted(send.items()):
            self._send(index, matched)
        return positives

    def _send(self, index: int, names: list[str]) -> None:
        recent = next((r for r in self._recent if r.frame.index == index), None)
        if recent is None:
            return  # older than the pre-roll buffer
        frame = recent.frame
        matched = {name: recent.scores[name] for name in names}
        kinds = {self._tracks[n].spec.encoding.kind for n in matched}
        for name in matched:
            track = self._tracks[name]
            if track.spec.encoding.kind == "clip":
                height, width = frame.image.shape[:2]
                track.clip = track.clip or ClipEncoder(width, height, self.fps or UNKNOWN_FPS)
                track.clip.add(frame.image, frame.timestamp)  # at the camera's real rate
        events = sorted({t.event_id for n in matched if (t := self._tracks[n]).event_id is not None})
        # Frames go in the stream once and in order. One already sent travels as metadata only; one a stream
        # filter's back-dated start reaches behind the stream's last frame cannot go in it, so goes as a JPEG.
        stream = "stream" in kinds and not recent.sent and frame.index > self._streamed
        recent.streamed |= stream
        encodings = [] if stream else [e for n in matched if (e := self._tracks[n].spec.encoding).kind != "clip"]
        jpeg = recent.jpeg_to_send(max(e.jpeg_quality for e in encodings)) if encodings else b""
        self.stats.matched += not recent.matched
        recent.matched = True
        self.stats.bytes_out += len(jpeg)
        self.sink.frame(
            MatchedFrame(self.camera, frame.index, frame.timestamp, recent.processed, matched, events, jpeg)
        )
        if stream:  # after the frame's message: the cloud links the frames a fragment holds when it arrives
            self._streamed = frame.index
            crop = self._crop(frame)
            image = self._upload_image(frame, crop)
            index, timestamp = frame.index, frame.timestamp
            self._stream_encoder().submit(lambda encoder: encoder.add(image, index, timestamp, crop))

    def _stream_encoder(self) -> EncodingThread:
        fps = self.fps or UNKNOWN_FPS
        if self._stream is None:
            u = self.upload
            encoder = StreamEncoder(fps, u.crf, u.preset, u.keyframe_interval, u.fragment_seconds, u.bitrate_cap)
            self._stream = EncodingThread(self.camera, encoder, self._emit)
        elif fps != self._stream_fps:  # a live camera's rate, measured after its stream opened: for the next GOPs
            self._stream.submit(lambda encoder: encoder.set_fps(fps))
        self._stream_fps = fps
        return self._stream

    def _crop(self, frame: Frame) -> Crop | None:
        """With `crop: roi`, the part of the frame the camera's stream filters look at (their ROIs' box)."""
        if self.upload.crop == "none":
            return None
        rois = [t.spec.roi for t in self._tracks.values() if t.spec.encoding.kind == "stream"]
        return roi_crop(rois, frame.image.shape[1], frame.image.shape[0])

    def _upload_image(self, frame: Frame, crop: Crop | None) -> np.ndarray:
        image = frame.image
        if crop is not None:
            image = image[crop.y : crop.y + crop.height, crop.x : crop.x + crop.width]
        if self.upload.scale == 1:
            return image
        height, width = image.shape[:2]
        # Even sides: the encoder would otherwise pad a row or column of repeated pixels.
        size = (max(2, round(width * self.upload.scale / 2) * 2), max(2, round(height * self.upload.scale / 2) * 2))
        return cv2.resize(image, size, interpolation=cv2.INTER_AREA)

    def _emit(self, fragments: list[Fragment]) -> None:
        """Send the closed fragments of the camera's stream (on the encoding thread)."""
        for fragment in fragments:
            self.stats.bytes_out += len(pack(fragment))
            self.sink.fragment(self.camera, fragment)

    def _end_event(self, track: _Track, event: Event) -> None:
        clip = track.clip.finish() if track.clip else None
        track.clip, track.event_id = None, None
        self.stats.bytes_out += len(clip or b"")
        if track.spec.encoding.kind == "stream" and self._stream is not None:
            # The event's last frames go now, not with the next event's: the encoder is drained unless another
            # stream event goes on (its next frames push them out).
            streaming = any(t.event_id is not None and t.spec.encoding.kind == "stream" for t in self._tracks.values())
            self._stream.submit(StreamEncoder.cut if streaming else StreamEncoder.finish)
            # The end message goes from the encoding thread, after the event's fragments (as the cloud expects),
            # while this thread goes on with the next frames: waiting here for x264 to drain stalled a 1080p
            # camera long enough to drop frames.
            self._stream.submit(lambda _encoder: self._send_end(event, clip))
        else:
            self._send_end(event, clip)

    def _send_end(self, event: Event, clip: bytes | None) -> None:
        log.info("camera %s: filter %s: event ended at frame %s", self.camera, event.filter, event.end_frame)
        self.sink.event("end", event, clip)

    def _sync_tracks(self, mcs: Iterable[LoadedMC]) -> None:
        """Start smoothers for new or changed filters; close the events of removed ones, and of those whose smoothing
        or upload changed (an event goes up one way: a stream event switched to clips lost its first frames' images)."""
        wanted = {mc.spec.name: mc.spec for mc in mcs}
        for name in list(self._tracks):
            old = self._tracks[name].spec
            if name not in wanted or (wanted[name].smoothing, wanted[name].encoding) != (old.smoothing, old.encoding):
                self._close_track(name)
        for name, spec in wanted.items():
            if name in self._tracks:
                self._tracks[name].spec = spec
                continue
            s = spec.smoothing
            self._tracks[name] = _Track(spec, Smoother(name, self.camera, s.threshold, s.k, s.n))
        depth = max((t.spec.smoothing.n for t in self._tracks.values()), default=1)
        if depth != self._recent.maxlen:
            self._recent = deque(self._recent, maxlen=depth)

    def _close_track(self, name: str) -> None:
        track = self._tracks.pop(name)
        self.state.history.pop(name, None)
        event = track.smoother.flush()
        if event is not None:
            self._end_event(track, event)

    def take_stats(self) -> StageStats:
        """The counters since the last call; counting starts afresh (for periodic stats lines)."""
        stats, self.stats = self.stats, StageStats()
        return stats

    def end_events(self) -> None:
        """End every open event at its last passing frame: at the end of the stream, or when the camera goes
        offline (an event must not span an outage); the next frame starts its filters' smoothing afresh. Returns
        once the camera's stream has sent every fragment and end message."""
        for name in list(self._tracks):
            self._close_track(name)
        if self._stream is not None:
            self._stream.wait()


def _gate(settings: GateSettings | None) -> ChangeGate | None:
    if settings is None or not settings.enabled:
        return None
    return ChangeGate(settings.pixel_delta, settings.changed_fraction, settings.max_skipped)


def _filters_of(mcs: tuple[LoadedMC, ...]) -> frozenset[tuple[str, int]]:
    return frozenset((mc.spec.name, mc.spec.version) for mc in mcs)
