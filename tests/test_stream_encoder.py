"""The matched-frame H.264 stream: fragments cut on time, keyframes only where a reader starts, the wire
format, and the cloud's joined MP4 and on-demand JPEG, all on real frames of the car clip."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from support import clip_frames

from cloud import streams
from cloud.db import Fragment as FragmentRow
from cloud.db import StoredFrame, make_engine, session_factory
from cloud.fragments import frame_jpeg, join_mp4
from cloud.framestore import FrameStore
from cloud.storage import Message, Storage
from common.fragment import Crop, Fragment, FragmentError, pack, unpack
from common.protocol import FragmentHeader, FrameHeader
from edge.encoder import encode_jpeg
from edge.stream_encoder import LOOKAHEAD, StreamEncoder, encoder_setup, roi_crop
from models.errors import FilterForwardError
from models.roi import ROI

FPS = 12.5
SIZE = (192, 108)
FIRST = 40  # frames FIRST.. of the clip: car A drives through


@pytest.fixture(scope="module")
def frames(intel_car: Path) -> list[np.ndarray]:
    return clip_frames(intel_car / "car-detection.mp4", FIRST, 80, SIZE)


def encode(
    frames: list[np.ndarray], events: list[range], encoder: StreamEncoder | None = None
) -> tuple[list[Fragment], dict[int, np.ndarray]]:
    """The fragments of the frames inside `events` (ranges of positions in `frames`), as the uplink would
    drive the encoder, each passed through the wire format; and the frames sent by camera index."""
    encoder = encoder or StreamEncoder(FPS, preset="veryfast", fragment_seconds=1.0)
    fragments, sent = [], {}
    for event in events:
        encoder.new_gop()
        closed = []
        for position in event:
            index = FIRST + position
            closed += encoder.add(frames[position], index, index / FPS)
            sent[index] = frames[position]
        closed += encoder.finish()
        fragments += [unpack(pack(f)) for f in closed]
    return fragments, sent


def mean_abs_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_fragments_close_after_about_a_second_and_keyframes_start_each_event(frames: list[np.ndarray]) -> None:
    fragments, sent = encode(frames, [range(0, 30), range(45, 80)])
    spans = [f.header.frames[-1].time - f.header.frames[0].time + 1 / FPS for f in fragments]
    # Every fragment but an event's last is a second of frames (13 at 12.5 fps); none is longer.
    assert all(span <= 1 + 1 / FPS for span in spans)
    assert sorted(len(f.header.frames) for f in fragments) == [4, 9, 13, 13, 13, 13]
    keyframes = [e.index for f in fragments for e in f.header.frames if e.keyframe]
    assert keyframes == [FIRST, FIRST + 45]  # one per event start, none inside a 3 s event
    assert [(f.header.gop, f.header.part) for f in fragments] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [e.index for f in fragments for e in f.header.frames] == sorted(sent)


def test_a_long_event_gets_a_keyframe_every_interval(frames: list[np.ndarray]) -> None:
    encoder = StreamEncoder(FPS, preset="veryfast", keyframe_interval=2.0, fragment_seconds=1.0)
    fragments, _ = encode(frames, [range(0, 80)], encoder)
    keyframes = [e.index - FIRST for f in fragments for e in f.header.frames if e.keyframe]
    assert keyframes == [0, 25, 50, 75]
    assert all(f.starts_gop == (f.header.frames[0].index - FIRST in keyframes) for f in fragments)


def test_the_joined_mp4_plays_every_sent_frame_at_its_stream_time(frames: list[np.ndarray]) -> None:
    fragments, sent = encode(frames, [range(0, 30), range(45, 80)])
    with av.open(io.BytesIO(join_mp4(fragments))) as container:
        decoded = [(float(p.time), p.to_ndarray(format="bgr24")) for p in container.decode(video=0)]
    assert len(decoded) == len(sent)
    times = [time for time, _ in decoded]
    assert times[30] - times[29] == pytest.approx(16 / FPS, abs=0.002)  # the gap between the events is kept
    for (_, picture), original in zip(decoded, sent.values(), strict=True):
        assert mean_abs_error(picture, original) < 6


def test_a_frame_decodes_to_jpeg_from_the_start_of_its_gop(frames: list[np.ndarray]) -> None:
    fragments, sent = encode(frames, [range(0, 30), range(45, 80)])
    second_gop = [f for f in fragments if f.header.gop == 1]
    for index in (FIRST + 45, FIRST + 70, FIRST + 79):
        holding = [f for f in second_gop if f.header.frames[0].index <= index]
        image = cv2.imdecode(np.frombuffer(frame_jpeg(holding, index), np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == sent[index].shape
        assert mean_abs_error(image, sent[index]) < 6
    with pytest.raises(FilterForwardError, match="frame 41 is not in the stored fragments"):
        frame_jpeg(second_gop, FIRST + 1)


def test_the_stream_costs_far_less_than_a_jpeg_per_frame(frames: list[np.ndarray]) -> None:
    fragments, sent = encode(frames, [range(0, 80)])
    h264 = sum(len(pack(f)) for f in fragments)  # the wire bytes, headers included
    jpeg = sum(len(encode_jpeg(frame, 80)) for frame in sent.values())
    assert h264 * 3 < jpeg


def test_a_gop_without_its_keyframe_is_refused(frames: list[np.ndarray]) -> None:
    fragments, _ = encode(frames, [range(0, 30)])
    with pytest.raises(FilterForwardError, match="must start at a keyframe"):
        join_mp4(fragments[1:])


def test_a_gop_missing_a_fragment_in_the_middle_is_refused(frames: list[np.ndarray]) -> None:
    fragments, _ = encode(frames, [range(0, 30)])
    with pytest.raises(FilterForwardError, match="part 2 of GOP 0 stored without part 1"):
        join_mp4([fragments[0], fragments[2]])


def test_a_long_events_clip_starts_at_the_first_gop_retention_left(frames: list[np.ndarray], tmp_path: Path) -> None:
    """Retention deletes the oldest fragments while an event goes on: its clip is the part still stored, from the
    first keyframe left, rather than nothing."""
    encoder = StreamEncoder(FPS, preset="veryfast", keyframe_interval=2.0, fragment_seconds=1.0)
    fragments, sent = encode(frames, [range(0, 80)], encoder)
    sessions, store = stored_stream(fragments, tmp_path)
    with sessions.begin() as session:  # what retention does to the oldest fragment: its row, then its file
        oldest = session.scalars(select(FragmentRow).order_by(FragmentRow.seq).limit(1)).one()
        session.delete(oldest)
    store.delete(oldest.path)
    with sessions() as session:
        rows = session.scalars(select(StoredFrame).order_by(StoredFrame.frame_index)).all()
        with pytest.raises(FilterForwardError, match="start of its stream segment has been removed"):
            streams.frame_image(session, store, rows[20])  # in the first GOP, whose keyframe went
        video = streams.event_video(session, store, rows)
    with av.open(io.BytesIO(video.mp4)) as container:
        decoded = [p.to_ndarray(format="bgr24") for p in container.decode(video=0)]
    assert len(decoded) == 80 - 25  # from the second keyframe to the event's last frame
    assert video.first_time == rows[25].stream_time
    assert mean_abs_error(decoded[0], sent[FIRST + 25]) < 6


def test_a_clip_from_the_stream_says_when_its_first_frame_plays(frames: list[np.ndarray], tmp_path: Path) -> None:
    """An event that begins inside a GOP another filter's event opened gets a clip from that GOP's keyframe: the
    cloud says how far into it the event begins (the API's X-Event-Start), there was no way to tell."""
    fragments, _ = encode(frames, [range(0, 40)])  # one GOP, opened at frame FIRST
    sessions, store = stored_stream(fragments, tmp_path)
    with sessions() as session:
        later = session.scalars(select(StoredFrame).where(StoredFrame.frame_index >= FIRST + 25)).all()
        video = streams.event_video(session, store, later)  # an event from frame FIRST + 25 on
    assert video.first_time == FIRST / FPS
    with av.open(io.BytesIO(video.mp4)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 40  # from the keyframe


def stored_stream(fragments: list[Fragment], folder: Path) -> tuple[sessionmaker, FrameStore]:
    """The fragments and their frames stored in a cloud database as the ingest stores them."""
    sessions = session_factory(make_engine(f"sqlite:///{folder / 'cloud.db'}"))
    store = FrameStore(folder / "store")
    storage, seq = Storage(sessions, store), iter(range(1, 1000))
    for fragment in fragments:  # the edge sends each frame's message before the fragment holding it
        for entry in fragment.header.frames:
            header = FrameHeader(edge="e", run="r", seq=next(seq), camera="c", frame=entry.index, timestamp=entry.time,
                                 wall_time=1.75e9 + entry.time, scores={"f": 0.9}, payload="none")  # fmt: skip
            storage.store_frame("e", header, b"")
        header = FragmentHeader(edge="e", run="r", seq=next(seq), camera="c", wall_time=1.75e9)
        assert storage.store_many([Message("e", header, pack(fragment))]).outcomes == ["stored"]
    return sessions, store


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "at least 4 bytes"),
        (struct.pack(">I", 999) + b"{}", "does not fit"),
        (struct.pack(">I", 2) + b"{}", "header is invalid: gop"),
        (struct.pack(">I", 3) + b"{x}", "header is invalid"),
    ],
)
def test_bytes_that_are_not_a_fragment_get_one_line(data: bytes, message: str) -> None:
    with pytest.raises(FragmentError, match=message) as error:
        unpack(data)
    assert "\n" not in str(error.value)


def test_a_fragment_cut_short_is_refused(frames: list[np.ndarray]) -> None:
    fragments, _ = encode(frames, [range(0, 5)])
    data = pack(fragments[0])
    with pytest.raises(FragmentError, match="sizes add up to a different length"):
        unpack(data[:-1])


def test_a_camera_whose_frame_size_changes_is_refused(frames: list[np.ndarray]) -> None:
    encoder = StreamEncoder(FPS)
    encoder.add(frames[0], 0, 0.0)
    with pytest.raises(FilterForwardError, match="must keep one size within a crop: got 96x54 after 192x108"):
        encoder.add(cv2.resize(frames[1], (96, 54)), 1, 0.08)


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"crf": 60}, "CRF must be 0..51"), ({"fps": 0}, "fps must be > 0"), ({"fragment_seconds": 0}, "must be > 0 s")],
)
def test_bad_settings_are_refused_before_encoding(settings: dict, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message):
        StreamEncoder(**{"fps": FPS, **settings})


@pytest.mark.parametrize(
    ("boxes", "size", "expected"),
    [
        ([(0.5, 0.25, 1.0, 0.75)], (384, 216), (192, 54, 192, 108)),
        ([(0.1, 0.1, 0.3, 0.2), (0.6, 0.5, 0.7, 0.9)], (384, 216), (38, 20, 232, 176)),  # the union's box, even
        ([(0.5, 0.5, 1.0, 1.0)], (385, 217), (192, 108, 192, 108)),  # an odd frame: the last pixel is left out
        ([(0.999, 0.999, 1.0, 1.0)], (385, 217), (382, 214, 2, 2)),  # at least 2x2, inside the frame
        ([(0.0, 0.0, 1.0, 1.0), (0.2, 0.2, 0.4, 0.4)], (384, 216), None),  # the whole frame: no crop
        ([], (384, 216), None),
    ],
)
def test_the_roi_crop_is_the_even_box_around_the_rois(boxes: list, size: tuple, expected: tuple | None) -> None:
    rois = [ROI(x0=x0, y0=y0, x1=x1, y1=y1) for x0, y0, x1, y1 in boxes]
    crop = roi_crop(rois, *size)
    assert (crop and (crop.x, crop.y, crop.width, crop.height)) == expected
    if crop is not None:
        assert crop.x % 2 == crop.y % 2 == crop.width % 2 == crop.height % 2 == 0
        assert (crop.frame_width, crop.frame_height) == size


def test_a_new_crop_starts_a_new_gop_at_its_size_and_the_header_says_which_part(frames: list[np.ndarray]) -> None:
    """The crop is fixed for a GOP: frames 0-19 show the left half, 20-39 the middle; each part decodes in the
    cloud from its own GOP, and its fragments carry the crop through the wire format."""
    left = Crop(x=0, y=0, width=96, height=108, frame_width=192, frame_height=108)
    middle = Crop(x=48, y=26, width=96, height=56, frame_width=192, frame_height=108)
    encoder = StreamEncoder(FPS, preset="veryfast")
    encoder.new_gop()
    closed = []
    for position in range(40):
        crop = left if position < 20 else middle
        part = frames[position][crop.y : crop.y + crop.height, crop.x : crop.x + crop.width]
        closed += encoder.add(part, FIRST + position, (FIRST + position) / FPS, crop)
    closed += encoder.finish()
    fragments = [unpack(pack(f)) for f in closed]
    keyframes = [e.index - FIRST for f in fragments for e in f.header.frames if e.keyframe]
    assert keyframes == [0, 20]  # the crop's change, not only event starts, begins a GOP
    assert {(f.header.gop, f.header.crop, f.header.width, f.header.height) for f in fragments} == {
        (0, left, 96, 108),
        (1, middle, 96, 56),
    }
    second = [f for f in fragments if f.header.gop == 1]
    image = cv2.imdecode(np.frombuffer(frame_jpeg(second, FIRST + 30), np.uint8), cv2.IMREAD_COLOR)
    assert mean_abs_error(image, frames[30][26:82, 48:144]) < 6  # the middle part of frame 30
    uncropped = StreamEncoder(FPS, preset="veryfast")
    uncropped.add(frames[0], 0, 0.0)
    assert b"crop" not in pack(*uncropped.finish())  # a whole-frame stream's header is as before crops


def test_frames_leave_the_encoder_after_its_look_ahead_and_finish_drains_it(frames: list[np.ndarray]) -> None:
    """x264's look-ahead holds LOOKAHEAD frames: `cut()` sends only what came out (the rest goes with the next
    frames, as when another stream event goes on), `finish()` sends everything, and the next frame starts a GOP."""
    encoder = StreamEncoder(FPS, preset="veryfast")
    encoder.new_gop()
    added = [encoder.add(frames[p], FIRST + p, (FIRST + p) / FPS) for p in range(LOOKAHEAD + 2)]
    assert added == [[]] * (LOOKAHEAD + 2)  # the first frames have not left yet; none spans half a second
    first = encoder.cut()
    assert [e.index - FIRST for e in first[0].header.frames] == [0, 1]
    rest = encoder.finish()
    assert [e.index - FIRST for f in rest for e in f.header.frames] == list(range(2, LOOKAHEAD + 2))
    assert encoder.finish() == [] and encoder.cut() == []
    later = encoder.add(frames[20], FIRST + 20, (FIRST + 20) / FPS) + encoder.finish()
    assert later[0].header.gop == first[0].header.gop + 1 and later[0].header.frames[0].keyframe


def test_a_1080p_stream_takes_a_faster_preset_on_two_threads_and_still_sends_every_frame_in_order(
    frames: list[np.ndarray],
) -> None:
    """Above 720p x264 runs preset fast on two frame threads (one thread at medium cannot keep up with a 12.5 fps
    1080p camera) unless the settings name a preset: frames still leave in order and every sent frame decodes."""
    assert encoder_setup(1280, 720) == ("medium", 1)
    assert encoder_setup(1920, 1080) == ("fast", 2)
    assert encoder_setup(1920, 1080, "veryfast") == ("veryfast", 2)
    large = [cv2.resize(frame, (1920, 1080)) for frame in frames[:12]]
    encoder = StreamEncoder(FPS, preset="ultrafast", fragment_seconds=0.5)
    fragments, sent = encode(large, [range(0, 12)], encoder)
    assert [e.index for f in fragments for e in f.header.frames] == sorted(sent)
    assert fragments[0].header.width == 1920 and fragments[0].header.height == 1080
    with av.open(io.BytesIO(join_mp4(fragments))) as container:
        decoded = [p.to_ndarray(format="bgr24") for p in container.decode(video=0)]
    assert len(decoded) == len(sent)
    for picture, original in zip(decoded, sent.values(), strict=True):
        assert mean_abs_error(picture, original) < 6


def test_a_stream_takes_a_camera_rate_measured_later_from_its_next_encoder(frames: list[np.ndarray]) -> None:
    """A live camera's rate is measured in its first seconds (edge.sources): a stream opened before at the default
    25 fps keeps it for the open encoder's fragments and takes the measured 12.5 fps from the next encoder on."""
    encoder = StreamEncoder(25.0, preset="veryfast")
    before, after = [], []
    for index, frame in enumerate(frames):
        if index == 4:
            encoder.set_fps(12.5)  # measured while the encoder is open
        if index == 8:
            before += encoder.finish()  # the camera's stream events ended
        (before if index < 8 else after).extend(encoder.add(frame, index, index / 12.5))
    after += encoder.finish()
    assert before and after
    assert {fragment.header.fps for fragment in before} == {"25/1"}
    assert {fragment.header.fps for fragment in after} == {"25/2"}
    with pytest.raises(FilterForwardError, match="fps must be > 0"):
        encoder.set_fps(0.0)
