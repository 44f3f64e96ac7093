"""MOTChallenge sequences as labelled datasets: per-frame events from ground-truth boxes and polygons.

An event "a person's bottom-centre is inside this polygon" is 1 on a frame when a counted pedestrian's
foot point lies in the polygon, -1 (uncertain) when only boxes MOT's evaluation ignores lie there
(consider flag 0, or the distractor classes), else 0. MOT frame f is decoded frame f-1. MOT starts a person's
track only once they are nearly whole in view: `edge_crossings` lists the walks across the picture's edge, and
`edge_frames` labels the frames next to them uncertain.

gt.txt layouts: MOT15 has 10 columns (frame, id, x, y, w, h, flag, world x/y/z) and only pedestrians;
MOT16/17/20 have 9 (frame, id, x, y, w, h, flag, class, visibility) with class 1 = pedestrian.
"""

from __future__ import annotations

import configparser
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.datasets.frames import FrameInfo, image_files, is_video, probe
from models.datasets.labelled import LabelledDataset, Polygon, check_event_name, write_labelled
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

FULL_FRAME_POLYGON = Polygon(((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0)))
DEFAULT_EVENTS: Mapping[str, Polygon] = {"person_present": FULL_FRAME_POLYGON}
PEDESTRIAN = 1
GT_LAYOUTS = {  # columns of gt.txt -> what they are
    9: "MOT16/17/20: frame,id,x,y,w,h,flag,class,visibility",
    10: "MOT15: frame,id,x,y,w,h,flag,world x,y,z",
}
NO_CLASS = -1  # MOT15 files, and some converted ones: every box is a pedestrian
# Person on vehicle, static person, distractor, reflection: MOT's evaluation ignores matches to these.
DISTRACTOR_CLASSES = (2, 7, 8, 12)
# A box within this share of the picture's width (height) of its edge touches it: a track that starts or ends with
# such a box walked in or out across the edge.
EDGE_SHARE = 0.01


@dataclass(frozen=True)
class EdgeCrossing:
    """A counted person who walks in (out) across the picture's edge: MOT starts (ends) their track only while they
    are nearly whole in view, so the frames just before (after) `frame` are labelled without them."""

    track: int
    frame: int  # 0-based: the track's first frame when entering, its last when leaving
    entering: bool


@dataclass(frozen=True)
class SeqInfo:
    name: str
    fps: float
    length: int
    width: int
    height: int
    image_dir: str


@dataclass(frozen=True, eq=False)
class _Sequence:
    root: Path
    info: SeqInfo
    source: Path
    frames: FrameInfo
    boxes: np.ndarray  # gt.txt rows, one per box


def read_seqinfo(root: Path) -> SeqInfo:
    path = root / "seqinfo.ini"
    if not path.is_file():
        raise FilterForwardError(f"{root} has no seqinfo.ini: give a MOTChallenge sequence folder")
    parser = configparser.ConfigParser()
    try:
        parser.read(path, encoding="utf-8-sig")  # -sig: an editor on Windows may prepend a BOM
        section = parser["Sequence"]
        info = SeqInfo(
            name=section.get("name", root.resolve().name),
            fps=float(section["frameRate"]),
            length=int(section["seqLength"]),
            width=int(section["imWidth"]),
            height=int(section["imHeight"]),
            image_dir=section.get("imDir", "img1"),
        )
    except (configparser.Error, KeyError, ValueError) as exc:
        reason = " ".join(str(exc).split())  # configparser's messages span lines
        raise FilterForwardError(
            f"{path} is incomplete ({reason}): it needs a [Sequence] with frameRate, seqLength, imWidth, imHeight"
        ) from None
    numbers = {"frameRate": info.fps, "seqLength": info.length, "imWidth": info.width, "imHeight": info.height}
    if bad := [f"{key}={value:g}" for key, value in numbers.items() if not 0 < value < math.inf]:
        raise FilterForwardError(f"{path} has {', '.join(bad)}: each must be a positive number")
    return info


def read_gt(path: Path) -> np.ndarray:
    """gt.txt as a float array with one row per box, in one of the GT_LAYOUTS."""
    if not path.is_file():
        raise FilterForwardError(f"{path} is missing: a MOTChallenge sequence needs gt/gt.txt for labels")
    rows = _number_rows(path, path.read_text(encoding="utf-8-sig"))
    if not rows.size:
        log.warning("%s holds no boxes: every frame is labelled without the events", path)
        return np.empty((0, 10))
    if rows.shape[1] not in GT_LAYOUTS:  # another layout's class column would be read as something else, silently
        layouts = "; ".join(f"{columns} ({names})" for columns, names in GT_LAYOUTS.items())
        raise FilterForwardError(f"{path} has {rows.shape[1]} columns: MOT ground truth has {layouts}")
    return rows


def _number_rows(path: Path, text: str) -> np.ndarray:
    """Comma-separated finite numbers, one row per line (blank lines skipped), every row as long as the first."""
    rows: list[list[float]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values = [float(field) for field in line.split(",")]
        except ValueError:
            values = []
        if not values or not all(math.isfinite(value) for value in values):
            raise FilterForwardError(
                f"{path} line {number} is {line.strip()[:60]!r}: MOT ground truth is comma-separated numbers"
            )
        if rows and len(values) != len(rows[0]):
            raise FilterForwardError(
                f"{path} line {number} has {len(values)} fields where the lines before have {len(rows[0])}: "
                "every line of MOT ground truth has the same columns"
            )
        rows.append(values)
    return np.array(rows, dtype=float).reshape(len(rows), -1)


def _check_numbered(folder: Path, images: list[Path]) -> None:
    """MOT names image i `00000i.jpg` and its boxes say frame i: a missing image would shift every later frame's
    labels onto the frame after it, so a gap (or a name that is no number) is refused."""
    for index, image in enumerate(images, start=1):
        if (numbers := re.findall(r"\d+", image.stem)) == [] or int(numbers[-1]) != index:
            raise FilterForwardError(
                f"{folder} has {image.name} as its image {index}: MOT names them 1, 2, 3, ... (000001{image.suffix}), "
                f"and boxes find their frame by that number; restore image {index} (or the sequence's own names)"
            )


def _find_source(root: Path, info: SeqInfo) -> Path:
    """The sequence's original images (imDir) when present, else its one video file."""
    image_dir = root / info.image_dir
    if image_dir.is_dir() and (images := image_files(image_dir)):
        _check_numbered(image_dir, images)
        return image_dir
    videos = [p for p in sorted(root.iterdir()) if is_video(p)]
    if len(videos) == 1:
        return videos[0]
    if not videos:
        raise FilterForwardError(f"{root} has neither {info.image_dir}/ images nor a video file: add the frames")
    raise FilterForwardError(f"{root} holds several videos ({', '.join(p.name for p in videos)}): keep one")


def _load(path: str | Path) -> _Sequence:
    root = Path(path).expanduser()
    if not root.is_dir():
        state = "is a file, not a folder" if root.exists() else "does not exist"
        raise FilterForwardError(f"MOT sequence folder {root} {state}: give the folder with seqinfo.ini")
    info = read_seqinfo(root)
    source = _find_source(root, info)
    frames = probe(source, info.fps)
    if frames.n_frames != info.length:
        log.warning(
            "%s: seqinfo.ini says %d frames, %d decode; labelling %d",
            root,
            info.length,
            frames.n_frames,
            frames.n_frames,
        )
    sequence = _Sequence(root, info, source, frames, read_gt(root / "gt" / "gt.txt"))
    _check_size(sequence)
    return sequence


OUTSIDE_SHARE = 0.05  # boxes whose foot point lies past seqinfo's image size: more than this, the size is suspect


def _check_size(seq: _Sequence) -> None:
    """Boxes are read in seqinfo.ini's image size (a video re-encoded at another size is fine); say when the frames
    decode at another size, and when many boxes' foot points lie past that size (a wrong imWidth or imHeight)."""
    width, height = seq.info.width, seq.info.height
    if seq.frames.frame_size != (width, height):
        log.warning(
            "%s: seqinfo.ini says %dx%d, the frames decode at %dx%d: the boxes are read in seqinfo's size (right when "
            "the video was rescaled from the sequence's images)",
            seq.root, width, height, *seq.frames.frame_size,
        )  # fmt: skip
    if not len(seq.boxes):
        return
    x, y, w, h = (seq.boxes[:, i] for i in range(2, 6))
    outside = ((x + w / 2) > width) | ((x + w / 2) < 0) | ((y + h) > height * (1 + OUTSIDE_SHARE))
    if outside.mean() > OUTSIDE_SHARE:
        log.warning(
            "%s: %d of %d boxes have their foot point outside the %dx%d image seqinfo.ini gives: check imWidth and "
            "imHeight (the labels place every box by them)",
            seq.root, int(outside.sum()), len(seq.boxes), width, height,
        )  # fmt: skip


def _box_kinds(seq: _Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(0-based frame, counted pedestrian?, ignored-by-MOT?) per box, dropping boxes outside the video."""
    boxes = seq.boxes
    frame = boxes[:, 0].astype(np.int64) - 1
    flag = boxes[:, 6]
    # Only the 9-column layout has a class column; MOT15's 8th column is a world coordinate.
    cls = boxes[:, 7] if boxes.shape[1] == 9 else np.full(len(boxes), NO_CLASS, dtype=float)
    person = (cls == PEDESTRIAN) | (cls == NO_CLASS)
    counted = person & (flag != 0)
    ignored = (person & (flag == 0)) | np.isin(cls, DISTRACTOR_CLASSES)
    inside = (frame >= 0) & (frame < seq.frames.n_frames)
    if not inside.all():
        log.warning("%s: %d boxes lie on frames the video does not have; ignored", seq.root, int((~inside).sum()))
    return frame, counted & inside, ignored & inside


def _foot_points(seq: _Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Bottom-centre of each box, clamped to the image (boxes may cross its border), normalised."""
    x, y, w, h = (seq.boxes[:, i] for i in range(2, 6))
    width, height = seq.info.width, seq.info.height
    return np.clip(x + w / 2, 0, width - 1) / width, np.clip(y + h, 0, height - 1) / height


def _event_labels(seq: _Sequence, events: Mapping[str, Polygon], edge_frames: int = 0) -> dict[str, np.ndarray]:
    if edge_frames < 0:
        raise FilterForwardError(
            f"edge frames must be 0 or more (frames next to a walk across the picture's edge), got {edge_frames}"
        )
    frame, counted, ignored = _box_kinds(seq)
    foot_x, foot_y = _foot_points(seq)
    crossings = _crossings(seq, frame, counted) if edge_frames else []
    labels = {}
    for name, polygon in events.items():
        inside = polygon.contains(foot_x, foot_y)
        values = np.zeros(seq.frames.n_frames, dtype=np.int8)
        values[frame[ignored & inside]] = -1
        for crossing, row in crossings:
            if inside[row]:
                first = crossing.frame - edge_frames if crossing.entering else crossing.frame + 1
                values[max(0, first) : max(0, first + edge_frames)] = -1
        values[frame[counted & inside]] = 1  # a counted person outweighs an ignored box or a crossing
        labels[check_event_name(name)] = values
    return labels


def _crossings(seq: _Sequence, frame: np.ndarray, counted: np.ndarray) -> list[tuple[EdgeCrossing, int]]:
    """Every counted track that starts (ends) with a box at the picture's edge, other than on the clip's first
    (last) frame, with the row of that box in gt.txt (`frame`, `counted`: _box_kinds)."""
    x, y, w, h = (seq.boxes[:, i] for i in range(2, 6))
    width, height = seq.info.width, seq.info.height
    margin_x, margin_y = EDGE_SHARE * width, EDGE_SHARE * height
    at_edge = (x <= margin_x) | (y <= margin_y) | (x + w >= width - margin_x) | (y + h >= height - margin_y)
    tracks = seq.boxes[:, 1].astype(np.int64)
    found = []
    for track in np.unique(tracks[counted]):
        rows = np.flatnonzero(counted & (tracks == track))
        rows = rows[np.argsort(frame[rows], kind="stable")]
        for row, entering in ((rows[0], True), (rows[-1], False)):
            clip_end = 0 if entering else seq.frames.n_frames - 1
            if at_edge[row] and frame[row] != clip_end:
                found.append((EdgeCrossing(int(track), int(frame[row]), entering), int(row)))
    return sorted(found, key=lambda pair: pair[0].frame)


def mot_dataset(path: str | Path, events: Mapping[str, Polygon] | None = None, edge_frames: int = 0) -> LabelledDataset:
    """A MOTChallenge sequence with events derived from its gt boxes (default: person_present, full frame); the
    `edge_frames` frames before (after) each of an event's edge crossings are uncertain where no one is counted."""
    seq = _load(path)
    return _as_dataset(seq, events or DEFAULT_EVENTS, edge_frames)


def edge_crossings(path: str | Path, events: Mapping[str, Polygon] | None = None) -> dict[str, list[EdgeCrossing]]:
    """Per event, the people who walk in or out across the picture's edge with their foot point in its region."""
    seq = _load(path)
    frame, counted, _ = _box_kinds(seq)
    crossings = _crossings(seq, frame, counted)
    foot_x, foot_y = _foot_points(seq)
    found = {}
    for name, polygon in (events or DEFAULT_EVENTS).items():
        inside = polygon.contains(foot_x, foot_y)
        found[name] = [crossing for crossing, row in crossings if inside[row]]
    return found


def _as_dataset(seq: _Sequence, events: Mapping[str, Polygon], edge_frames: int) -> LabelledDataset:
    return LabelledDataset(
        root=seq.root,
        name=seq.info.name,
        source=seq.source,
        fps=seq.frames.fps,
        frame_size=seq.frames.frame_size,
        n_frames=seq.frames.n_frames,
        labels=_event_labels(seq, events, edge_frames),
        # A polygon around the whole picture is the full frame: no region (it was shown and written as a polygon).
        regions={name: polygon for name, polygon in events.items() if polygon != FULL_FRAME_POLYGON},
    )


def export_mot(
    path: str | Path,
    out_dir: str | Path,
    events: Mapping[str, Polygon] | None = None,
    overwrite: bool = False,
    edge_frames: int = 0,
) -> LabelledDataset:
    """Write a MOT sequence as a labelled folder (labels.csv + dataset.yaml pointing at its frames by
    absolute path; nothing is copied). labels.csv also gets mot_frame and n_persons for reference."""
    seq = _load(path)
    dataset = _as_dataset(seq, events or DEFAULT_EVENTS, edge_frames)
    frame, counted, _ = _box_kinds(seq)
    extra = {
        "mot_frame": np.arange(1, seq.frames.n_frames + 1),
        "n_persons": np.bincount(frame[counted], minlength=seq.frames.n_frames),
    }
    return write_labelled(dataset, out_dir, extra_columns=extra, overwrite=overwrite)
