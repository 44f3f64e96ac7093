"""The on-disk labelled dataset: frames (video or image folder) + labels.csv + optional dataset.yaml.

labels.csv has `frame_index` (0-based decoded frame) first, then columns. Event columns hold 0, 1 or
-1 (uncertain); dataset.yaml may list them under `events:`, otherwise every column whose values are
all 0/1/-1 is an event and the others (counts, ids) are ignored. Frames without a row are uncertain.
An optional `camera_frame` column (the cloud's datasets write it) gives each frame's index in its camera's stream,
so frames sampled apart or joined from several times are known not to follow each other. See docs/datasets.md.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from models.cache import write_whole
from models.datasets.frames import IMAGE_SUFFIXES, VIDEO_SUFFIXES, image_files, is_video, probe, read_frames
from models.errors import FilterForwardError, validation_summary
from models.evaluation import runs
from models.filterspec import EVENT_PATTERN
from models.roi import FULL_FRAME, INPUT, ROI, Polygon

log = logging.getLogger(__name__)

LABELS_FILE = "labels.csv"
CAMERA_FRAME = "camera_frame"  # labels.csv's optional column of each frame's index in its camera's stream
CONFIG_FILE = "dataset.yaml"
FRAME_INDEX = "frame_index"
UNCERTAIN = -1
EVENT_VALUES = frozenset({"0", "1", "-1"})
NEAR_EVENT = 0.9  # a column with at least this share of 1/0/-1 values was meant as an event
_EVENT_NAME = re.compile(EVENT_PATTERN)


Region = ROI | Polygon
BOX_KEYS = ("x0", "y0", "x1", "y1")
REGION_FORMS = "give a box {x0: .., y0: .., x1: .., y1: ..} or a polygon [[x, y], [x, y], [x, y], ...] in 0..1"


class DatasetConfig(BaseModel):
    """dataset.yaml: everything optional; paths are relative to the dataset folder (or absolute)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    video: str | None = None
    images: str | None = None
    # strict: YAML's `true` is no frame rate (lax parsing made it 1 fps)
    fps: float | None = Field(
        None, gt=0, le=1000, strict=True, allow_inf_nan=False, description="frame rate; required for image folders"
    )
    events: list[str] | None = Field(None, description="event columns of labels.csv (default: detected)")
    regions: dict[str, Region] = Field(default_factory=dict, description="event name -> its region")

    @field_validator("events")
    @classmethod
    def _event_names(cls, value: list[str] | None) -> list[str] | None:
        for index, name in enumerate(value or []):
            if (problem := event_name_problem(name)) is not None:
                raise ValueError(problem)
            if name in value[:index]:
                raise ValueError(f"event {name!r} is listed twice: list each event once")
        return value

    @field_validator("regions", mode="before")
    @classmethod
    def _one_kind_each(cls, value: object, info: ValidationInfo) -> object:
        """Each region read as the kind its form says (a list of points: a polygon; a mapping: a box, or a polygon
        with its box), so that what is wrong with it is said once, not once for every kind it might have been."""
        if not isinstance(value, dict):
            return value
        kinds: dict[type, type[BaseModel]] = {list: Polygon, dict: ROI}
        regions = {}
        for event, region in value.items():
            if isinstance(region, ROI | Polygon):
                regions[event] = region
            elif (kind := kinds.get(type(region))) is None:
                raise ValueError(f"region of {event!r} is {region!r}: {REGION_FORMS}")
            else:
                try:
                    regions[event] = kind.model_validate(region, context=info.context)
                except ValidationError as exc:
                    raise ValueError(_region_error(event, exc)) from None
                if kind is ROI and "polygon" not in region and (missing := [k for k in BOX_KEYS if k not in region]):
                    # ROI's defaults are the full frame: a forgotten corner would silently widen the region.
                    raise ValueError(f"region of {event!r} lacks {', '.join(missing)}: {REGION_FORMS}")
        return regions

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if self.video and self.images:
            raise ValueError("give either video or images, not both")
        return self


def _region_error(event: str, exc: ValidationError) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"])
    return f"region of {event!r}{f' ({field})' if field else ''}: {error['msg'].removeprefix('Value error, ')}"


@dataclass(frozen=True, eq=False)
class LabelledDataset:
    """A recorded camera clip with per-frame event labels (0, 1, or -1 = uncertain)."""

    root: Path
    name: str
    source: Path  # video file or image folder
    fps: float
    frame_size: tuple[int, int]  # (width, height)
    n_frames: int
    labels: dict[str, np.ndarray]  # event -> int8 array of length n_frames
    regions: dict[str, Region] = field(default_factory=dict)  # event -> the region it is about
    # Each frame's index in its camera's stream (-1: unknown); None: the frames follow each other in one stream.
    camera_frames: np.ndarray | None = None

    def events(self) -> list[str]:
        return list(self.labels)

    def require_event(self, event: str, then: str = "") -> None:
        """A FilterForwardError naming the events there are when `event` is not one of them (and why not, when
        labels.csv has a column of that name); `then` ends the message."""
        if event not in self.labels:
            why = _why_not_an_event(self.root / LABELS_FILE, event)
            raise FilterForwardError(
                f"dataset {self.name} has no event {event!r}{why}; its events are {', '.join(self.events())}{then}"
            )

    def consecutive(self, start: int, stop: int) -> np.ndarray:
        """Per frame of [start, stop): whether it is the camera frame right after the one before it (False for
        `start`)."""
        follows = np.zeros(stop - start, bool)
        if self.camera_frames is None:
            follows[1:] = True
        else:
            frames = self.camera_frames[start:stop]
            follows[1:] = (np.diff(frames) == 1) & (frames[:-1] >= 0)
        return follows

    def frames(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(index, BGR uint8 frame) for frames start..stop-1, decoded in order."""
        stop = self.n_frames if stop is None else min(stop, self.n_frames)
        if not 0 <= start <= stop:
            raise FilterForwardError(f"frame range {start}..{stop} is outside 0..{self.n_frames} of {self.name}")
        return read_frames(self.source, start, stop)

    def roi(self, event: str) -> ROI:
        """The region an MC for this event should look at (a box, or a polygon and its box), else the full frame."""
        region = self.regions.get(event)
        if isinstance(region, Polygon):
            return region.roi()
        return region or FULL_FRAME

    def labels_digest(self, event: str) -> str:
        """labels_digest of the event's labels and region as training reads them."""
        labels = self.labels[event]
        return labels_digest(np.flatnonzero(labels == 1), np.flatnonzero(labels == 0), self.roi(event))

    def intervals(self, event: str) -> list[tuple[int, int]]:
        """Separate occurrences of an event as (first, last) frame, inclusive; uncertain frames are skipped."""
        values = self.labels[event]
        certain = np.flatnonzero(values != UNCERTAIN)
        return [(int(certain[s]), int(certain[e])) for s, e in runs(values[certain] == 1)]


def labels_digest(positive: Iterable[int], negative: Iterable[int], roi: ROI) -> str:
    """A fingerprint of what training learns an event from: its positive and negative frames and its region. The
    cloud compares a trained job's with the dataset's current one (labels.csv cannot tell unlabelled frames from
    uncertain ones, and neither is trained on, so neither counts)."""
    what = {"positive": sorted(map(int, positive)), "negative": sorted(map(int, negative)), "roi": roi.model_dump()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def check_event_name(name: str) -> str:
    if (problem := event_name_problem(name)) is not None:
        raise FilterForwardError(problem)
    return name


def event_name_problem(name: str) -> str | None:
    """What is wrong with an event name, None if nothing."""
    if not _EVENT_NAME.match(name) or name in (FRAME_INDEX, CAMERA_FRAME):
        return (
            f"event name {name!r} is not allowed: use letters, digits, '_', '.', '-' (not {FRAME_INDEX!r} or "
            f"{CAMERA_FRAME!r})"
        )
    return None


def open_dataset(path: str | Path) -> LabelledDataset:
    """Open a labelled dataset folder (labels.csv + a video or image folder, optional dataset.yaml)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        state = "is a file, not a folder" if root.exists() else "does not exist"
        raise FilterForwardError(f"dataset folder {root} {state}: give a folder holding {LABELS_FILE}")
    labels_path = root / LABELS_FILE
    if not labels_path.is_file():
        hint = (
            f"it is a MOTChallenge sequence: convert it with `filterforward dataset mot {root} ...`"
            if (root / "seqinfo.ini").is_file()
            else f"add {LABELS_FILE} (see docs/datasets.md)"
        )
        raise FilterForwardError(f"{root} has no {LABELS_FILE}: {hint}")
    config = _read_config(root)
    source = _find_source(root, config)
    info = probe(source, config.fps)
    table = read_table(labels_path)
    labels = read_labels(table, info.n_frames, config.events)
    unknown = sorted(set(config.regions) - set(labels))
    if unknown:
        raise FilterForwardError(f"{root / CONFIG_FILE} has regions for {unknown}, which are no events: remove them")
    return LabelledDataset(
        root=root,
        name=config.name or root.resolve().name,
        source=source,
        fps=info.fps,
        frame_size=info.frame_size,
        n_frames=info.n_frames,
        labels=labels,
        regions=dict(config.regions),
        camera_frames=read_camera_frames(table, info.n_frames),
    )


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last: `fps: 25` then `fps: 30`
    read as 30 without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise FilterForwardError(
                    f"key {key!r} is given twice (lines {seen[key]} and {key_node.start_mark.line + 1}): keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _read_config(root: Path) -> DatasetConfig:
    path = root / CONFIG_FILE
    if not path.is_file():
        return DatasetConfig()
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader) or {}
        return DatasetConfig.model_validate(data, context=INPUT)
    except FilterForwardError as exc:
        raise FilterForwardError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise FilterForwardError(f"{path} is not valid YAML ({_one_line(exc)}): fix its syntax") from None
    except UnicodeDecodeError:
        raise FilterForwardError(f"{path} is not UTF-8 text: save it as UTF-8") from None
    except ValidationError as exc:
        raise FilterForwardError(
            f"{path} is invalid at {validation_summary(exc, 'top level')} (see docs/datasets.md)"
        ) from None


def frame_source(root: Path) -> tuple[Path, float | None]:
    """A dataset folder's frames (its video file or image folder) and the frame rate its dataset.yaml sets, if any,
    without reading its labels: what plays it as a camera needs, whatever state the labels are in."""
    config = _read_config(root)
    return _find_source(root, config), config.fps


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _find_source(root: Path, config: DatasetConfig) -> Path:
    named = config.video or config.images
    if named:
        source = root / Path(named).expanduser()
        kind_ok = source.is_file() if config.video else source.is_dir()
        if not kind_ok:
            kind = "video file" if config.video else "image folder"
            raise FilterForwardError(
                f"{root / CONFIG_FILE} names {kind} {source}, which {_why_not(source)}: fix the path"
            )
        return source
    candidates = [p for p in sorted(root.iterdir()) if is_video(p) or (p.is_dir() and image_files(p))]
    if image_files(root):
        candidates.append(root)
    if len(candidates) == 1:
        return candidates[0]
    kinds = f"a video ({', '.join(sorted(VIDEO_SUFFIXES))}) or an image folder ({', '.join(sorted(IMAGE_SUFFIXES))})"
    if not candidates:
        if broken := [p for p in sorted(root.iterdir()) if p.suffix.lower() in VIDEO_SUFFIXES and not p.exists()]:
            raise FilterForwardError(f"{root} holds no frames: {broken[0].name} {_why_not(broken[0])}: fix the link")
        raise FilterForwardError(f"{root} holds no frames: add {kinds}, or name it in {CONFIG_FILE}")
    names = ", ".join(p.name for p in candidates)
    raise FilterForwardError(f"{root} holds several frame sources ({names}): name one in {CONFIG_FILE}")


def _why_not(path: Path) -> str:
    """Why `path` is not the file or folder a dataset.yaml names: it is the other kind, a broken link, or missing."""
    if path.is_dir():
        return "is a folder"
    if path.exists():
        return "is a file"
    if path.is_symlink():
        return f"is a link to {path.readlink()}, which does not exist"
    return "does not exist"


class Table(NamedTuple):
    """labels.csv, read once: its header, its rows and each row's frame_index."""

    path: Path
    header: list[str]
    rows: list[list[str]]
    frame_index: np.ndarray


def read_table(path: Path) -> Table:
    header, rows, lines = _read_csv(path)
    return Table(path, header, rows, _frame_indices(path, rows, lines))


def read_labels(table: Table, n_frames: int, events: list[str] | None = None) -> dict[str, np.ndarray]:
    """Event columns of a labels.csv as int8 arrays of length n_frames (-1 where a frame has no row)."""
    path, header, rows, frame_index = table
    columns = {name: [row[i] for row in rows] for i, name in enumerate(header) if i > 0}
    detected = [n for n, values in columns.items() if set(values) <= EVENT_VALUES and n != CAMERA_FRAME]
    names = events if events is not None else detected
    if events is None:  # a column of labels with a stray value is data, not an event: say so, not silently
        for name, values in columns.items():
            if name not in detected and name != CAMERA_FRAME and _label_share(values) >= NEAR_EVENT:
                bad = _first_non_label(values)
                log.warning(
                    "%s: column %r is no event: it holds %r on frame %d (an event's values are 1, 0 and -1); fix that "
                    "value to use it as one",
                    path, name, values[bad], frame_index[bad],
                )  # fmt: skip
    for name in names:  # a name becomes part of paths (a bundle's folder) and of filter specs
        if (problem := event_name_problem(name)) is not None:
            raise FilterForwardError(f"{path}: {problem}: rename that column")
    missing = [name for name in names if name not in columns]
    if missing:
        raise FilterForwardError(f"{path} lacks the event columns {missing} named in {CONFIG_FILE}: add or unlist them")
    if events is not None and not events:
        raise FilterForwardError(
            f"{CONFIG_FILE} lists no events (events: []): list the {path.name} columns that are events, or drop the "
            "events: line to take every column of 0, 1 and -1 (a dataset the cloud wrote has none until an event "
            "is labelled: label one in the studio)"
        )
    if not names:
        raise FilterForwardError(
            f"{path} has no event column (values 0, 1 or -1 on every row{_first_non_event_value(columns, frame_index)})"
            ": add one"
        )
    inside = frame_index < n_frames
    if len(frame_index) and not inside.any():
        raise FilterForwardError(
            f"{path} labels frames {frame_index.min()} to {frame_index.max()}, but the video has {n_frames} "
            f"(0 to {n_frames - 1}): frame_index counts the decoded frames from 0; is it this video's labels file?"
        )
    if not inside.all():
        log.warning(
            "%s: %d rows are past the last of the %d decoded frames and are ignored (frame_index is 0-based)",
            path,
            int((~inside).sum()),
            n_frames,
        )
    labels = {}
    for name in names:
        values = _event_values(path, name, columns[name], frame_index)
        labels[name] = np.full(n_frames, UNCERTAIN, dtype=np.int8)
        labels[name][frame_index[inside]] = values[inside]
    return labels


def read_camera_frames(table: Table, n_frames: int) -> np.ndarray | None:
    """labels.csv's camera_frame column over the n_frames frames (-1 where a frame has no row); None without it."""
    path, header, rows, frame_index = table
    if CAMERA_FRAME not in header:
        return None
    column = header.index(CAMERA_FRAME)
    frames = np.full(n_frames, -1, np.int64)
    for index, row in zip(frame_index.tolist(), rows, strict=True):
        try:
            value = int(row[column])
        except ValueError:
            raise FilterForwardError(
                f"{path}: {CAMERA_FRAME} {row[column]!r} of frame {index} is not a whole number: fix or drop the column"
            ) from None
        if index < n_frames:
            frames[index] = value
    return frames


def _read_csv(path: Path) -> tuple[list[str], list[list[str]], list[int]]:
    """The header, the rows and each row's line in the file; blank lines (spaces or empty cells only: a
    spreadsheet's empty row) are left out."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:  # -sig: spreadsheets may prepend a BOM
            reader = csv.reader(handle)
            read = [([cell.strip() for cell in row], reader.line_num) for row in reader]
            table, lines = [row for row, _ in read if any(row)], [line for row, line in read if any(row)]
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise FilterForwardError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} on line {line}): save it as UTF-8 CSV"
        ) from None
    if not table or table[0][0] != FRAME_INDEX:
        found = f" (it starts {table[0][0][:40]!r})" if table else " (it is empty)"
        separator = "; separate columns with commas" if table and table[0][0].startswith(FRAME_INDEX) else ""
        raise FilterForwardError(
            f"{path} must start with a header whose first column is {FRAME_INDEX!r}{found}{separator}"
        )
    header, rows, lines = table[0], table[1:], lines[1:]
    if len(set(header)) != len(header):
        raise FilterForwardError(f"{path} repeats a column name in its header: give each column its own name")
    for line, row in zip(lines, rows, strict=True):
        if len(row) != len(header):
            raise FilterForwardError(f"{path} line {line} has {len(row)} fields, the header {len(header)}: fix it")
    return header, rows, lines


def _first_non_event_value(columns: dict[str, list[str]], frame_index: np.ndarray) -> str:
    """Where the column most like an event (most of its values 0/1/-1) leaves them, as '; NAME holds V on frame F'."""
    candidates = [(name, values) for name, values in columns.items() if name != CAMERA_FRAME and values]
    if not candidates:
        return ""
    name, values = max(candidates, key=lambda candidate: _label_share(candidate[1]))  # the first on a tie
    bad = _first_non_label(values)
    return "" if bad is None else f"; {name!r} holds {values[bad]!r} on frame {frame_index[bad]}"


def _label_share(values: list[str]) -> float:
    """The share of the values that are event labels (1, 0, -1)."""
    return sum(value in EVENT_VALUES for value in values) / len(values) if values else 0.0


def _why_not_an_event(path: Path, column: str) -> str:
    """Why labels.csv's column of this name is no event ('' when the file or the column is not there)."""
    if not path.is_file():
        return ""
    header, rows, _ = _read_csv(path)
    if column not in header:
        return ""
    position = header.index(column)
    bad = _first_non_label([row[position] for row in rows])
    if bad is None:
        return f" (labels.csv has the column, but {CONFIG_FILE}'s events: does not list it)"
    row = rows[bad]
    return f" (its labels.csv column holds {row[position]!r} on frame {row[0]}: an event's values are 1, 0 and -1)"


def _first_non_label(values: list[str]) -> int | None:
    """The index of the first value that is no event label (1, 0, -1), or None."""
    return next((i for i, value in enumerate(values) if value not in EVENT_VALUES), None)


_WHOLE_NUMBER = re.compile(r"^\s*-?[0-9]+\s*$")  # ASCII digits: int() also reads '1_0' as 10 and other scripts' digits
_MAX_FRAME_DIGITS = 18  # int64


def _frame_indices(path: Path, rows: list[list[str]], lines: list[int]) -> np.ndarray:
    indices = np.empty(len(rows), dtype=np.int64)
    for number, (line, row) in enumerate(zip(lines, rows, strict=True)):
        text = row[0]
        if not _WHOLE_NUMBER.match(text):
            raise FilterForwardError(
                f"{path} line {line}: {FRAME_INDEX} {text!r} is not a whole number: use 0-based frame numbers"
            )
        if len(text.strip().lstrip("-")) > _MAX_FRAME_DIGITS:
            raise FilterForwardError(f"{path} line {line}: {FRAME_INDEX} {text!r} is far past any video's frames")
        indices[number] = int(text)
    if (indices < 0).any():
        raise FilterForwardError(f"{path} has a negative {FRAME_INDEX}: use 0-based decoded frame numbers")
    unique, counts = np.unique(indices, return_counts=True)
    if (counts > 1).any():
        raise FilterForwardError(f"{path} lists frame {int(unique[counts > 1][0])} twice: keep one row per frame")
    return indices


def _event_values(path: Path, name: str, values: list[str], frame_index: np.ndarray) -> np.ndarray:
    bad = _first_non_label(values)
    if bad is not None:
        raise FilterForwardError(
            f"{path}: event {name!r} has value {values[bad]!r} on frame {frame_index[bad]}; event columns hold 0, 1 or "
            "-1 (uncertain)"
        )
    return np.asarray(values, dtype=np.int64).astype(np.int8)


def check_output(out_dir: Path, names: list[str], overwrite: bool) -> None:
    """Refuse to clobber a dataset unless asked to; create the folder."""
    existing = [name for name in names if (out_dir / name).exists()]
    if existing and not overwrite:
        raise FilterForwardError(
            f"{out_dir} already holds {', '.join(existing)}: choose another folder or overwrite them (--force)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)


def write_labelled(
    dataset: LabelledDataset,
    out_dir: str | Path,
    extra_columns: Mapping[str, np.ndarray] | None = None,
    overwrite: bool = False,
) -> LabelledDataset:
    """Write labels.csv and dataset.yaml for `dataset` into out_dir (frames stay where they are) and reopen it.

    The source is written relative to out_dir when it lies inside it, else as an absolute path.
    `extra_columns` (e.g. counts) are written after the events; they are information, not events.
    """
    out = Path(out_dir).expanduser()
    events = [check_event_name(name) for name in dataset.events()]
    extra = dict(extra_columns or {})
    if clash := sorted(set(events) & set(extra)):  # checked before anything is written
        raise FilterForwardError(
            f"event {clash[0]!r} has the name of a column labels.csv holds besides the events ({', '.join(extra)}): "
            "name the event otherwise"
        )
    check_output(out, [LABELS_FILE, CONFIG_FILE], overwrite)
    table = np.column_stack([np.arange(dataset.n_frames)] + [dataset.labels[e] for e in events] + list(extra.values()))
    header = ",".join([FRAME_INDEX, *events, *extra])
    labels = io.StringIO()
    np.savetxt(labels, table.astype(np.int64), fmt="%d", delimiter=",", header=header, comments="")
    source = dataset.source.resolve()
    try:
        where = str(source.relative_to(out.resolve()))
    except ValueError:
        where = str(source)
    config = DatasetConfig(
        name=dataset.name,
        video=None if source.is_dir() else where,
        images=where if source.is_dir() else None,
        fps=dataset.fps if source.is_dir() else None,
        events=events,
        regions=dataset.regions,
    )
    text = yaml.safe_dump(config.model_dump(mode="json", exclude_none=True), sort_keys=False, default_flow_style=None)
    write_whole(out, {LABELS_FILE: labels.getvalue().encode(), CONFIG_FILE: text.encode()})
    return open_dataset(out)
