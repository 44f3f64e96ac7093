"""Replay a labelled dataset through the real edge pipeline and score it the paper's way.

The frames go through the same CameraPipeline a live camera uses (every-frame pacing), into a sink
that records what was sent; the recorded decisions are then scored against the labels, and the bytes
sent are compared with sending the whole stream as H.264.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import ValidationError

from common.fragment import Fragment, pack
from edge.config import GateSettings, UploadSettings
from edge.encoder import ClipEncoder, encode_jpeg, encode_stream_h264
from edge.mcbank import MCBank
from edge.pipeline import CameraPipeline
from edge.sink import MatchedFrame
from edge.sources import Frame
from models.basednn import BaseDNN
from models.bundle import load_bundles
from models.datasets import LabelledDataset
from models.datasets.labelled import UNCERTAIN
from models.errors import FilterForwardError, validation_summary
from models.evaluation import EventScores, bandwidth_bps, check_tolerance, event_f1, runs, scored_frames
from models.filterspec import FilterSpec
from models.mc_kinds import MCWeights
from models.motion import HISTORY
from models.progress import progress_bar
from models.smoother import Event

log = logging.getLogger(__name__)
CAMERA = "replay"


EDGE_GATE = GateSettings()  # the change gate as an edge camera has it by default


@dataclass
class RecordingSink:
    """A sink that keeps what the pipeline sends, for scoring."""

    frames: dict[str, set[int]] = field(default_factory=dict)  # filter -> matched frame indices
    jpeg_bytes: int = 0
    clip_bytes: int = 0
    stream_bytes: int = 0  # the matched-frame H.264 stream's fragments as the uplink sends them
    events: list[Event] = field(default_factory=list)
    skipped: int = 0  # frames the change gate found unchanged (their base DNN run was saved)

    def frame(self, matched: MatchedFrame) -> None:
        self.jpeg_bytes += len(matched.jpeg)
        for name in matched.scores:
            self.frames.setdefault(name, set()).add(matched.index)

    def event(self, kind: Literal["start", "end"], event: Event, clip: bytes | None = None) -> None:
        self.clip_bytes += len(clip or b"")
        if kind == "end":
            self.events.append(event)

    def fragment(self, camera: str, fragment: Fragment) -> None:
        self.stream_bytes += len(pack(fragment))

    def close(self) -> None:
        pass

    @property
    def sent_bytes(self) -> int:
        """Every payload byte the pipeline sent."""
        return self.jpeg_bytes + self.clip_bytes + self.stream_bytes


@dataclass(frozen=True)
class FilterReport:
    name: str
    event: str
    scores: EventScores
    matched_frames: int
    events: int
    trained_frames: tuple[int, int] | None = None  # the replayed frames it was trained on (its bundle says), if any


@dataclass(frozen=True)
class ReplayReport:
    dataset: str
    frames: tuple[int, int]
    fps: float
    tolerance: int
    filters: list[FilterReport]
    upload_bps: float  # what the pipeline sent, per each filter's encoding (payload bytes, as the uplink sends)
    jpeg_bps: float  # matched frames as JPEG q80
    clip_bps: float  # matched frames as H.264 event clips
    stream_bps: float  # the whole stream as H.264 at the same CRF and resolution
    crf: int
    skipped: int  # frames the change gate found unchanged (the base DNN did not run on them)
    mc_weights: MCWeights  # what the MC bank's FC layers ran with

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def replay(
    dataset: LabelledDataset,
    bundles: list[Path],
    frames: tuple[int, int],
    base_model: Path | None = None,
    progress: bool = True,
    upload: UploadSettings | None = None,
    gate: GateSettings | None = EDGE_GATE,
    weights: MCWeights = "fp32",
) -> RecordingSink:
    """Run the dataset's frames [start, stop) through a fresh edge pipeline with these filters (the change gate
    at the edge's default settings unless `gate` says otherwise; None: the base DNN on every frame), the MC
    bank's FC weights as an edge with `mc_weights: weights` runs them. A motion veto's background model first sees
    the frames before the range, as a live camera's would have."""
    # A replay is no camera of the filters' edges: a filter for named cameras is evaluated all the same.
    specs = [(spec.model_copy(update={"cameras": ["*"]}), onnx) for spec, onnx in load_bundles(bundles)]
    if not specs:
        raise FilterForwardError("no filters to evaluate: pass at least one filter bundle")
    input_size = specs[0][0].input_size
    base = BaseDNN(input_size, base_model)
    bank = MCBank(base.taps, base.input_size, base_model=base.identity, weights=weights)
    bank.put_many(specs)
    sink = RecordingSink()
    pipeline = CameraPipeline(CAMERA, base, bank, sink, dataset.fps, upload, gate)
    start, stop = frames
    pipeline.warm_up(image for _, image in dataset.frames(max(0, start - HISTORY), start))
    for index, image in progress_bar(
        progress, iterable=dataset.frames(start, stop), total=stop - start, desc="replay", unit="frame"
    ):
        pipeline.process(Frame(index=index, timestamp=index / dataset.fps, image=image))
    pipeline.end_events()
    bank.close()
    sink.skipped = pipeline.stats.skipped
    return sink


def evaluate(
    dataset: LabelledDataset,
    bundles: list[Path],
    frames: tuple[int, int],
    tolerance: int = 2,
    crf: int = 23,
    event: str | None = None,
    base_model: Path | None = None,
    progress: bool = True,
    weights: MCWeights = "fp32",
) -> ReplayReport:
    """Replay, then score each filter (event F1 per the paper) and the bandwidth of what was sent. Every setting is
    checked before the replay starts."""
    check_tolerance(tolerance)
    try:
        upload = UploadSettings(crf=crf)
    except ValidationError as exc:
        raise FilterForwardError(f"upload settings: {validation_summary(exc)}") from None
    specs = [spec for spec, _ in load_bundles(bundles)]
    labels = {spec.name: _label_for(dataset, spec, event) for spec in specs}
    trained = {spec.name: _trained_frames(dataset, spec, frames) for spec in specs}
    start, stop = frames
    for label in set(labels.values()):
        if not (dataset.labels[label][start:stop] != UNCERTAIN).any():  # F1 would read 1.000 with nothing scored
            raise FilterForwardError(
                f"frames {start}:{stop} hold no frame labelled 0 or 1 for event {label!r} (all uncertain): nothing "
                "to score; give --frames where the event is labelled"
            )
        if not scored_frames(dataset.labels[label][start:stop], tolerance):  # precision would read 1.000 likewise
            raise FilterForwardError(
                f"a boundary tolerance of {tolerance} frames leaves no frame of {start}:{stop} scored for event "
                f"{label!r} (every labelled frame is that close to where the event starts or ends): lower --tolerance"
            )
    sink = replay(dataset, bundles, frames, base_model, progress, upload, weights=weights)
    reports = []
    for name, label in labels.items():
        predicted = np.zeros(stop - start, bool)
        matched = sorted(sink.frames.get(name, ()))
        predicted[np.asarray(matched, int) - start] = True
        scores = event_f1(dataset.labels[label][start:stop], predicted, tolerance)
        n_events = sum(1 for e in sink.events if e.filter == name)
        reports.append(FilterReport(name, label, scores, len(matched), n_events, trained[name]))
    sent = sorted(set().union(*sink.frames.values())) if sink.frames else []
    n = stop - start
    return ReplayReport(
        dataset=dataset.name,
        frames=frames,
        fps=dataset.fps,
        tolerance=tolerance,
        filters=reports,
        upload_bps=bandwidth_bps(sink.sent_bytes, n, dataset.fps),
        jpeg_bps=bandwidth_bps(_jpeg_bytes(dataset, sent, frames), n, dataset.fps),
        clip_bps=bandwidth_bps(_clip_bytes(dataset, sent, frames, crf), n, dataset.fps),
        stream_bps=bandwidth_bps(
            encode_stream_h264((image for _, image in dataset.frames(start, stop)), dataset.fps, crf=crf),
            n,
            dataset.fps,
        ),
        crf=crf,
        skipped=sink.skipped,
        mc_weights=weights,
    )


def _trained_frames(dataset: LabelledDataset, spec: FilterSpec, frames: tuple[int, int]) -> tuple[int, int] | None:
    """The part of `frames` the filter was trained on, when its bundle says it was trained on this dataset."""
    if spec.trained_on is None or spec.trained_on.dataset != dataset.name:
        return None
    start, stop = max(frames[0], spec.trained_on.frames[0]), min(frames[1], spec.trained_on.frames[1])
    return (start, stop) if start < stop else None


def _label_for(dataset: LabelledDataset, spec: FilterSpec, event: str | None) -> str:
    """The label column a filter is scored against, checked before any frame is replayed."""
    label = event or spec.event
    dataset.require_event(label, f": pass --event to score filter {spec.name!r} against one of them")
    return label


def _jpeg_bytes(dataset: LabelledDataset, sent: list[int], frames: tuple[int, int], quality: int = 80) -> int:
    """Bytes when each sent frame travels as one JPEG."""
    wanted = set(sent)
    return sum(len(encode_jpeg(image, quality)) for index, image in dataset.frames(*frames) if index in wanted)


def _clip_bytes(dataset: LabelledDataset, sent: list[int], frames: tuple[int, int], crf: int) -> int:
    """H.264 bytes when each run of sent frames travels as one event clip."""
    start, stop = frames
    mask = np.zeros(stop - start, bool)
    mask[np.asarray(sent, int) - start] = True
    ends = {first + start: last + start for first, last in runs(mask)}  # clip start -> clip end
    total, current, end = 0, None, -1
    for index, image in dataset.frames(start, stop):
        if index in ends:
            current = ClipEncoder(image.shape[1], image.shape[0], dataset.fps, crf=crf)
            end = ends[index]
        if current is not None:
            current.add(image)
            if index == end:
                total += len(current.finish())
                current = None
    return total
