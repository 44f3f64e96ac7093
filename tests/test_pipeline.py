"""The edge data path end to end on a real clip: base DNN, MC bank, smoothing, encoding, folder sink."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from edge.config import GateSettings, UploadSettings
from edge.mcbank import MCBank
from edge.pipeline import CameraPipeline
from edge.sink import FolderSink, MatchedFrame
from edge.sources import Frame, open_source
from models.basednn import BaseDNN
from models.filterspec import Encoding, MotionVeto
from models.motion import SETTLE_FRAMES
from models.roi import ROI
from models.smoother import Event

SIZE = (384, 224)
JPEG = Encoding(kind="jpeg")
EAGER, PATIENT = {"k": 1, "n": 1}, {"k": 3, "n": 5}  # PATIENT's event starts at frame 2, back-dated to 0


@pytest.fixture(scope="module")
def base() -> BaseDNN:
    return BaseDNN(SIZE)


def run_clip(
    clip: Path,
    base: BaseDNN,
    bank: MCBank,
    out: Path,
    upload: UploadSettings | None = None,
    change: tuple[int, Callable[[], object]] | None = None,
) -> tuple[CameraPipeline, list[dict]]:
    """The clip through a camera pipeline into a folder sink; `change`: (frame, what to do to the bank before it)."""
    sink = FolderSink(out)
    with open_source(str(clip), pacing="every-frame") as source:
        pipeline = CameraPipeline("cam", base, bank, sink, source.fps, upload)
        for frame in source:
            if change is not None and frame.index == change[0]:
                change[1]()
            pipeline.process(frame)
    pipeline.end_events()
    sink.close()
    return pipeline, [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def test_always_firing_filter_sends_every_frame_as_one_event(short_clip, base, make_filter, tmp_path) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="always", bias=10.0, encoding=JPEG))
    pipeline, records = run_clip(short_clip, base, bank, tmp_path)
    frames = [r for r in records if r["type"] == "frame"]
    assert sorted(r["index"] for r in frames) == list(range(40))  # the pre-roll frames are sent too
    starts = [r for r in records if r["type"] == "event_start"]
    ends = [r for r in records if r["type"] == "event_end"]
    assert len(starts) == len(ends) == 1
    assert (ends[0]["start_frame"], ends[0]["end_frame"]) == (0, 39)
    assert all(r["events"] == [ends[0]["id"]] and r["scores"]["always"] > 0.99 for r in frames)
    image = cv2.imread(str(tmp_path / frames[5]["file"]))
    assert image.shape == (216, 384, 3)  # the camera's own frame goes out, not the DNN input
    assert pipeline.stats.frames == 40 and pipeline.stats.matched == 40


def test_silent_filter_sends_nothing(short_clip, base, make_filter, tmp_path) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("localized", "mid", SIZE, name="never", bias=-10.0))
    pipeline, records = run_clip(short_clip, base, bank, tmp_path)
    assert records == []
    assert pipeline.stats.frames == 40 and pipeline.stats.matched == 0


def test_clip_policy_sends_one_mp4_per_event(short_clip, base, make_filter, tmp_path) -> None:
    bank = MCBank(base.taps, SIZE)
    clip_policy = Encoding(kind="clip")
    bank.put(*make_filter("full_frame", "late", SIZE, name="clipper", bias=10.0, encoding=clip_policy))
    _, records = run_clip(short_clip, base, bank, tmp_path)
    (end,) = [r for r in records if r["type"] == "event_end"]
    with av.open(str(tmp_path / end["clip"])) as container:
        decoded = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
    assert len(decoded) == 40 and decoded[0].shape == (216, 384, 3)
    assert all(r["file"] is None for r in records if r["type"] == "frame")  # no JPEGs for a clip-only filter
    assert not list((tmp_path / "frames").rglob("*.jpg"))


def decode_stream(out: Path, records: list[dict]) -> list[np.ndarray]:
    """The stream fragments' files in the order they were written, decoded as one raw H.264 stream."""
    data = b"".join((out / r["file"]).read_bytes() for r in records if r["type"] == "fragment")
    decoder = av.CodecContext.create("h264", "r")
    packets = decoder.parse(data) + decoder.parse(None)  # the parser holds the last unit until flushed
    pictures = [picture for packet in packets for picture in decoder.decode(packet)]
    pictures += decoder.decode(None)
    return [picture.to_ndarray(format="bgr24") for picture in pictures]


def test_stream_is_the_default_and_sends_each_matched_frame_once_in_fragments(
    short_clip, base, make_filter, tmp_path
) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="streamer", bias=10.0))
    bank.put(*make_filter("full_frame", "mid", SIZE, name="streamer-too", bias=10.0))
    pipeline, records = run_clip(short_clip, base, bank, tmp_path)
    fragments = [r for r in records if r["type"] == "fragment"]
    sent = [index for r in fragments for index in r["frames"]]
    assert sent == list(range(40))  # two filters match every frame; each goes once, in order
    assert [r["gop"] for r in fragments] == [0] * len(fragments)  # one event start: one keyframe
    # Half-second fragments (6-7 frames of a 12.5 fps clip) up to frame 31; at the clip's end the first filter's
    # event end sends what has left the encoder, the second's drains it (the look-ahead's last frames).
    assert [len(r["frames"]) for r in fragments] == [6, 7, 6, 6, 7, 3, 5]
    decoded = decode_stream(tmp_path, records)
    assert len(decoded) == 40 and decoded[0].shape == (216, 384, 3)
    assert all(r["file"] is None for r in records if r["type"] == "frame")  # no JPEGs for stream filters
    units = sum((tmp_path / r["file"]).stat().st_size for r in fragments)
    assert units < pipeline.stats.bytes_out < units + 2000 * len(fragments)  # the units plus small headers


def test_a_stream_event_that_ends_mid_clip_sends_its_end_after_its_fragments(
    short_clip, base, make_filter, tmp_path
) -> None:
    """The end message goes from the encoding thread, behind the event's fragments, while the camera goes on."""
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="streamer", bias=10.0))
    bank.put(*make_filter("full_frame", "late", SIZE, name="jpegs", bias=10.0, encoding=JPEG))
    # Its event ends at frame 19; the camera goes on with the JPEG filter.
    _, records = run_clip(short_clip, base, bank, tmp_path, change=(20, lambda: bank.remove("streamer")))
    end = next(i for i, r in enumerate(records) if r["type"] == "event_end" and r["filter"] == "streamer")
    fragments = [i for i, r in enumerate(records) if r["type"] == "fragment"]
    assert records[end]["end_frame"] == 19
    assert [f for r in records if r["type"] == "fragment" for f in r["frames"]] == list(range(20))
    assert max(fragments) < end  # every fragment of the event went before its end
    assert sorted(r["index"] for r in records if r["type"] == "frame" and "jpegs" in r["scores"]) == list(range(40))


def test_a_filter_whose_upload_changes_mid_event_ends_that_event_and_starts_another(
    short_clip, base, make_filter, tmp_path
) -> None:
    """A stream event switched to JPEG went on as one event whose first frames had no image anywhere."""
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="switched", bias=10.0, smoothing=EAGER))
    jpeg = make_filter("full_frame", "late", SIZE, "switched", version=2, bias=10.0, smoothing=EAGER, encoding=JPEG)
    # The same filter, sending JPEGs from frame 20 on.
    _, records = run_clip(short_clip, base, bank, tmp_path, change=(20, lambda: bank.put(*jpeg)))
    ends = [r for r in records if r["type"] == "event_end"]
    assert [(r["start_frame"], r["end_frame"]) for r in ends] == [(0, 19), (20, 39)]
    assert [f for r in records if r["type"] == "fragment" for f in r["frames"]] == list(range(20))
    jpegs = [r for r in records if r["type"] == "frame" and r["file"] is not None]
    assert [r["index"] for r in jpegs] == list(range(20, 40)) and all(r["events"] == [ends[1]["id"]] for r in jpegs)


def test_stream_upload_scale_downsizes_what_is_sent(short_clip, base, make_filter, tmp_path) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="small", bias=10.0, encoding=Encoding(kind="stream")))
    _, records = run_clip(short_clip, base, bank, tmp_path, UploadSettings(scale=0.5, crf=30))
    decoded = decode_stream(tmp_path, records)
    assert len(decoded) == 40 and decoded[0].shape == (108, 192, 3)


def test_filters_with_different_cameras_and_no_filters(short_clip, base, make_filter, tmp_path) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="elsewhere", bias=10.0, cameras=["other"]))
    pipeline, records = run_clip(short_clip, base, bank, tmp_path)
    assert records == [] and pipeline.stats.frames == 40
    assert pipeline.stats.base_seconds == 0.0  # no MC for this camera: the base DNN is not even run


def test_windowed_and_localized_run_side_by_side(short_clip, base, make_filter, tmp_path) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("windowed", "mid", SIZE, name="win", bias=10.0))
    bank.put(*make_filter("localized", "mid", SIZE, name="loc", bias=-10.0))
    pipeline, records = run_clip(short_clip, base, bank, tmp_path)
    matched = [r for r in records if r["type"] == "frame"]
    assert len(matched) == 40 and all(set(r["scores"]) == {"win"} for r in matched)
    assert np.isfinite(pipeline.stats.mc_seconds)


def test_a_frame_goes_out_as_jpeg_once_when_a_second_filter_backfills_it(
    short_clip, base, make_filter, tmp_path
) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="eager", bias=10.0, smoothing=EAGER, encoding=JPEG))
    bank.put(*make_filter("full_frame", "late", SIZE, name="patient", bias=10.0, smoothing=PATIENT, encoding=JPEG))
    pipeline, records = run_clip(short_clip, base, bank, tmp_path)
    first_two = [r for r in records if r["type"] == "frame" and r["index"] in (0, 1)]
    # Frames 0 and 1 go out for "eager" at once, then again for "patient" when its event starts at frame 2
    # and is back-dated: the second time as metadata pointing at the JPEG already sent.
    assert [(r["index"], list(r["scores"])) for r in first_two] == [
        (0, ["eager"]),
        (1, ["eager"]),
        (0, ["patient"]),
        (1, ["patient"]),
    ]
    assert first_two[0]["file"] == first_two[2]["file"] and first_two[2]["file"] is not None
    # A frame's wall time is when it was processed, whichever filter sent it and when (it was when it was sent: the
    # back-dated frames 0-1 of "patient" came after frame 2, and the cloud's feedback put them after it).
    processed: dict[int, float] = {}
    for record in records:
        if record["type"] == "frame":
            assert processed.setdefault(record["index"], record["wall_time"]) == record["wall_time"]
    assert [processed[index] for index in sorted(processed)] == sorted(processed.values())
    on_disk = sum(path.stat().st_size for path in (tmp_path / "frames").rglob("*.jpg"))
    assert pipeline.stats.bytes_out == on_disk  # each of the 40 frames' JPEG was sent exactly once
    assert pipeline.stats.matched == 40  # frames matched, not messages (frames 0-1 were counted twice: 42 of 40)


@pytest.mark.parametrize("eager", ["stream", "jpeg"])
def test_a_frame_two_encodings_match_goes_out_once(eager, short_clip, base, make_filter, tmp_path) -> None:
    """A stream filter and a JPEG filter on every frame: each frame's image leaves once. The first match
    decides how (the stream wins a tie); the other filter's match of frames 0-1 (its back-dated start) is
    metadata only."""
    patient = {"stream": "jpeg", "jpeg": "stream"}[eager]
    bank = MCBank(base.taps, SIZE)
    bank.put(
        *make_filter("full_frame", "late", SIZE, name="eager", bias=10.0, smoothing=EAGER, encoding={"kind": eager})
    )
    bank.put(
        *make_filter(
            "full_frame", "mid", SIZE, name="patient", bias=10.0, smoothing=PATIENT, encoding={"kind": patient}
        )
    )
    pipeline, records = run_clip(short_clip, base, bank, tmp_path)
    streamed = [index for r in records if r["type"] == "fragment" for index in r["frames"]]
    jpegs = sorted(int(path.stem) for path in (tmp_path / "frames").rglob("*.jpg"))
    if eager == "stream":
        assert streamed == list(range(40)) and jpegs == []
    else:  # frames 0-1 went as JPEGs before the stream filter's event started
        assert jpegs == [0, 1] and streamed == list(range(2, 40))
    frames = [r for r in records if r["type"] == "frame"]
    assert len(frames) == 42  # frames 0-1 once per filter, then one message for both filters' matches
    assert len(decode_stream(tmp_path, records)) == len(streamed)
    units = sum((tmp_path / r["file"]).stat().st_size for r in records if r["type"] == "fragment")
    on_disk = sum(path.stat().st_size for path in (tmp_path / "frames").rglob("*.jpg"))
    assert units + on_disk < pipeline.stats.bytes_out < units + on_disk + 2000 * (len(streamed) // 10 + 2)


def test_upload_crop_roi_sends_the_box_around_the_stream_filters_rois(short_clip, base, make_filter, tmp_path) -> None:
    """With `crop: roi` the stream shows the part of the frame the stream filters look at, at the upload scale;
    a filter added mid-clip widens the box, and the new box starts a new GOP."""
    right = {"x0": 0.5, "y0": 0.25, "x1": 1.0, "y1": 0.75}
    left = {"x0": 0.0, "y0": 0.5, "x1": 0.25, "y1": 1.0}
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="right", bias=10.0, roi=right))
    bank.put(*make_filter("full_frame", "late", SIZE, name="whole", bias=10.0, encoding=JPEG))  # not in the box
    sink = FolderSink(tmp_path)
    with open_source(str(short_clip), pacing="every-frame") as source:
        pipeline = CameraPipeline("cam", base, bank, sink, source.fps, UploadSettings(crop="roi", scale=0.5))
        for frame in source:
            if frame.index == 20:
                bank.put(*make_filter("full_frame", "late", SIZE, name="left", bias=10.0, roi=left))
            pipeline.process(frame)
    pipeline.end_events()
    sink.close()
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    fragments = [r for r in records if r["type"] == "fragment"]
    assert [i for r in fragments for i in r["frames"]] == list(range(40))  # the stream wins over the JPEG filter
    box = {"frame_width": 384, "frame_height": 216}
    first = {(r["gop"], tuple(r["crop"].values())) for r in fragments if r["frames"][0] < 20}
    assert first == {(0, tuple({"x": 192, "y": 54, "width": 192, "height": 108, **box}.values()))}
    later = [r for r in fragments if r["frames"][0] >= 20]
    assert later[0]["frames"][0] == 20 and later[0]["gop"] == 1  # the box changed: a new GOP
    assert {tuple(r["crop"].values()) for r in later} == {
        tuple({"x": 0, "y": 54, "width": 384, "height": 162, **box}.values())
    }
    gops = {}
    for r in fragments:
        gops.setdefault(r["gop"], []).append(r)
    shapes = {gop: {p.shape for p in decode_stream(tmp_path, rs)} for gop, rs in gops.items()}
    assert shapes[0] == {(54, 96, 3)} and all(s == {(80, 192, 3)} for g, s in shapes.items() if g > 0)


def scores_per_frame(clip: Path, base: BaseDNN, bank: MCBank, out: Path, gate: GateSettings | None) -> dict:
    """Every frame's score of the filter `all` (threshold 1e-9: it matches every frame) and the pipeline."""
    sink = FolderSink(out)
    with open_source(str(clip), pacing="every-frame") as source:
        pipeline = CameraPipeline("cam", base, bank, sink, source.fps, gate=gate)
        for frame in source:
            pipeline.process(frame)
    pipeline.end_events()
    sink.close()
    records = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return {"pipeline": pipeline, "scores": {r["index"]: r["scores"]["all"] for r in records if r["type"] == "frame"}}


@pytest.fixture(scope="module")
def empty_lot(intel_car: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Frames 30-69 of the real car clip: the empty lot, then the first white car driving in (from frame 54)."""
    from models.datasets import open_dataset

    out = tmp_path_factory.mktemp("lot") / "lot.mp4"
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 384, 216, "yuv420p"
        for _, image in open_dataset(intel_car).frames(30, 70):
            small = cv2.resize(image, (384, 216), interpolation=cv2.INTER_AREA)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(small, format="bgr24")))
        container.mux(stream.encode(None))
    return out


def test_the_change_gate_reuses_the_last_processed_frames_scores_on_the_still_lot(
    empty_lot, base, make_filter, tmp_path
) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="all", smoothing={"threshold": 1e-9, "k": 1, "n": 1}))
    every = scores_per_frame(empty_lot, base, bank, tmp_path / "every", gate=None)
    gated = scores_per_frame(empty_lot, base, bank, tmp_path / "gated", gate=GateSettings(max_skipped=100))
    assert sorted(every["scores"]) == sorted(gated["scores"]) == list(range(40))  # every frame still matched
    skipped = [i for i in range(40) if gated["scores"][i] != every["scores"][i]]
    assert gated["pipeline"].stats.skipped >= 10  # the still lot (frames 30-53 of the clip) is mostly skipped
    processed = 40 - gated["pipeline"].stats.skipped
    assert processed >= 5  # the car driving in is seen
    # A frame either ran the base DNN (the same score as without the gate) or reused the last such frame's score.
    last = None
    for index in range(40):
        if gated["scores"][index] == every["scores"][index]:
            last = gated["scores"][index]
        else:
            assert gated["scores"][index] == last, f"frame {index} neither scored nor reused"
    assert len(skipped) <= gated["pipeline"].stats.skipped


def test_a_camera_with_a_windowed_filter_is_not_gated(empty_lot, base, make_filter, tmp_path) -> None:
    """A windowed MC reads the small changes between frames that the gate ignores: its camera runs every frame."""
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("windowed", "mid", SIZE, name="all", smoothing={"threshold": 1e-9, "k": 1, "n": 1}))
    every = scores_per_frame(empty_lot, base, bank, tmp_path / "every", gate=None)
    gated = scores_per_frame(empty_lot, base, bank, tmp_path / "gated", gate=GateSettings(max_skipped=100))
    assert gated["pipeline"].stats.skipped == 0
    assert gated["scores"] == every["scores"] and len(every["scores"]) == 40


def test_a_new_filter_version_runs_the_base_dnn_again(empty_lot, base, make_filter, tmp_path) -> None:
    bank = MCBank(base.taps, SIZE)
    threshold = {"threshold": 1e-9, "k": 1, "n": 1}
    bank.put(*make_filter("full_frame", "late", SIZE, name="all", smoothing=threshold))
    sink = FolderSink(tmp_path)
    pipeline = CameraPipeline("cam", base, bank, sink, 12.0, gate=GateSettings(max_skipped=100))
    with open_source(str(empty_lot), pacing="every-frame") as source:
        frames = [frame for frame, _ in zip(source, range(4), strict=False)]
    for frame in frames[:2]:
        pipeline.process(frame)
    assert pipeline.stats.skipped == 1  # the second frame of the still lot
    bank.put(*make_filter("full_frame", "late", SIZE, name="all", version=2, bias=5.0, smoothing=threshold))
    pipeline.process(frames[2])
    assert pipeline.stats.skipped == 1  # version 2 has no scores yet: processed
    pipeline.process(frames[3])
    assert pipeline.stats.skipped == 2
    sink.close()


def test_a_motion_veto_keeps_a_filter_quiet_on_the_still_lot_until_the_car_drives_in(
    empty_lot, base, make_filter, tmp_path
) -> None:
    bank = MCBank(base.taps, SIZE)
    eager = {"threshold": 0.5, "k": 1, "n": 1}
    veto = MotionVeto(min_foreground=0.01, frames=5)
    bank.put(*make_filter("full_frame", "late", SIZE, name="plain", bias=10.0, smoothing=eager, encoding=JPEG))
    bank.put(*make_filter("full_frame", "late", SIZE, name="moving", bias=10.0, smoothing=eager, encoding=JPEG,
                          motion=veto))  # fmt: skip
    sent = {}
    for warmed in (False, True):
        sink = FolderSink(tmp_path / str(warmed))
        pipeline = CameraPipeline("cam", base, bank, sink, 12.0)
        with open_source(str(empty_lot), pacing="every-frame") as source:
            frames = list(source)
        if warmed:  # as a camera that has been running, or a replay of a later part: it has seen the still lot
            pipeline.warm_up(still_lot(frames))
        for frame in frames:
            pipeline.process(frame)
        pipeline.end_events()
        sink.close()
        records = [json.loads(line) for line in (tmp_path / str(warmed) / "events.jsonl").read_text().splitlines()]
        sent[warmed] = {name: {r["index"] for r in records if r["type"] == "frame" and name in r["scores"]}
                        for name in ("plain", "moving")}  # fmt: skip
    assert sent[False]["plain"] == sent[True]["plain"] == set(range(40))
    # A fresh model's first SETTLE_FRAMES frames are unknown motion, as in training: they hold nothing back.
    assert sent[False]["moving"] == set(range(40))
    assert not sent[True]["moving"] & set(range(24)), sorted(sent[True]["moving"])
    assert len(sent[True]["moving"] & set(range(26, 40))) >= 10  # the car drives in from frame 24


def still_lot(frames: list[Frame]) -> list[np.ndarray]:
    """The still lot's frames (before the car drives in at 24) over and over, enough to settle a background model."""
    return [frames[index % 24].image for index in range(SETTLE_FRAMES + 10)]


def test_the_background_model_goes_on_when_a_vetoed_filter_leaves_and_starts_afresh_for_a_region_it_lacks(
    empty_lot, base, make_filter, tmp_path
) -> None:
    bank = MCBank(base.taps, SIZE)
    vetoed = {"bias": 10.0, "smoothing": {"threshold": 0.5, "k": 1, "n": 1}, "encoding": JPEG,
              "motion": MotionVeto(min_foreground=0.01, frames=5)}  # fmt: skip
    bank.put(*make_filter("full_frame", "late", SIZE, name="left", roi=ROI(x0=0.0, x1=0.5), **vetoed))
    bank.put(*make_filter("full_frame", "late", SIZE, name="right", roi=ROI(x0=0.5, x1=1.0), **vetoed))
    sink = FolderSink(tmp_path)
    pipeline = CameraPipeline("cam", base, bank, sink, 12.0)
    with open_source(str(empty_lot), pacing="every-frame") as source:
        frames = list(source)[:24]  # the still lot, before the car drives in
    pipeline.warm_up(still_lot(frames))
    for frame in frames:
        if frame.index == 12:  # its region was modelled with the other's: the model goes on
            bank.remove("right")
        if frame.index == 18:  # a region outside what the model covers: a fresh one, its motion unknown at first
            bank.put(*make_filter("full_frame", "late", SIZE, name="top", roi=ROI(y0=0.0, y1=0.3), **vetoed))
        pipeline.process(frame)
    sink.close()
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    left = {r["index"] for r in records if r["type"] == "frame" and "left" in r["scores"]}
    assert not left & set(range(18)), sorted(left)
    assert set(range(18, 24)) <= left


def test_a_restarted_edge_keeps_the_files_of_the_start_before(tmp_path: Path) -> None:
    """Frame indexes and event ids start again with every start (a live camera counts from 0): the second start
    wrote its frame 60 and its clip over the first start's."""
    starts = [FolderSink(tmp_path), FolderSink(tmp_path)]
    event = Event("gate/cars/60", "cars", "gate", 60, 2.4, 61, 2.44, 0.9, 60)
    for number, sink in enumerate(starts):
        sink.frame(MatchedFrame("gate", 60, 2.4, time.time(), {"cars": 0.9}, [event.id], f"jpeg {number}".encode()))
        sink.event("end", event, clip=f"clip {number}".encode())
        sink.close()
    assert starts[0].run != starts[1].run
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(record["type"], record["run"]) for record in records] == [
        ("frame", starts[0].run), ("event_end", starts[0].run), ("frame", starts[1].run), ("event_end", starts[1].run)
    ]  # fmt: skip
    for record, content in zip(records, [b"jpeg 0", b"clip 0", b"jpeg 1", b"clip 1"], strict=True):
        assert (tmp_path / record.get("file", record.get("clip"))).read_bytes() == content
