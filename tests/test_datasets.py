"""The labelled dataset format, its frame reading, the MOTChallenge reader and the `dataset` CLI."""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from filterforward.commands import dataset as dataset_command
from models.datasets import (
    LabelledDataset,
    Polygon,
    edge_crossings,
    export_mot,
    mot_dataset,
    open_dataset,
    write_labelled,
    write_synthetic,
)
from models.datasets.frames import probe, read_frames
from models.datasets.labelled import check_event_name
from models.errors import FilterForwardError
from models.roi import FULL_FRAME, ROI

LEFT_THIRD = "0,0 0.3328125,0 0.3328125,1 0,1"  # x < 213 px of 640, the SOURCE.md examples
FULL = "0,0 1,0 1,1 0,1"


@pytest.fixture(autouse=True)
def scratch_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FILTERFORWARD_CACHE", str(cache))
    return cache


@pytest.fixture
def stadtmitte(shared_data: Path) -> Path:
    return _clip(shared_data, "tud-stadtmitte")


@pytest.fixture
def campus(shared_data: Path) -> Path:
    return _clip(shared_data, "tud-campus")


def _clip(shared_data: Path, name: str) -> Path:
    path = shared_data / name
    if not path.is_dir():
        pytest.skip(f"{path} is missing")
    return path


def _write_images(folder: Path, n: int, size: tuple[int, int] = (64, 48)) -> None:
    folder.mkdir(parents=True)
    for i in range(n):
        cv2.imwrite(str(folder / f"f{i + 1}.png"), np.full((size[1], size[0], 3), 10 * i, dtype=np.uint8))


def _image_dataset(root: Path, labels: str, config: str = "fps: 10\n") -> Path:
    """A small image-folder dataset: 12 flat grey frames named f1..f12 (natural order != text order)."""
    _write_images(root / "frames", 12)
    (root / "labels.csv").write_text(labels)
    (root / "dataset.yaml").write_text(config)
    return root


# --- real clips -----------------------------------------------------------------------------------


def test_intel_car_clip_events_counts_and_frames(intel_car: Path) -> None:
    ds = open_dataset(intel_car)
    assert (ds.n_frames, ds.fps, ds.frame_size) == (377, 12.5, (768, 432))
    # n_vehicles (0/1/2) and vehicle_ids (letters) are not events.
    assert ds.events() == ["vehicle_present", "red_vehicle_present", "white_vehicle_present"]
    assert [int((ds.labels[e] == 1).sum()) for e in ds.events()] == [146, 52, 88]
    assert all(ds.labels[e].dtype == np.int8 and len(ds.labels[e]) == 377 for e in ds.events())
    assert ds.intervals("red_vehicle_present") == [(187, 238)]
    assert ds.intervals("vehicle_present") == [(54, 108), (181, 238), (315, 347)]
    assert ds.roi("vehicle_present") == ROI()
    frames = list(ds.frames(375))
    assert [i for i, _ in frames] == [375, 376]
    assert frames[0][1].shape == (432, 768, 3) and frames[0][1].dtype == np.uint8


def test_frame_ranges_decode_the_same_pixels(campus: Path) -> None:
    ds = open_dataset(campus)
    whole = dict(ds.frames())
    assert sorted(whole) == list(range(71))
    for index, image in ds.frames(40, 43):
        assert np.array_equal(image, whole[index])
    with pytest.raises(FilterForwardError, match="outside"):
        ds.frames(80)


def test_opening_a_clip_writes_nothing_beside_it(stadtmitte: Path, scratch_cache: Path) -> None:
    before = sorted(p.name for p in stadtmitte.rglob("*"))
    ds = open_dataset(stadtmitte)
    assert ds.events() == ["person_present"]  # mot_frame and n_persons are not events
    assert sorted(p.name for p in stadtmitte.rglob("*")) == before
    assert len(list((scratch_cache / "frame-counts").iterdir())) == 1  # the frame count went to the cache


@pytest.mark.parametrize("clip", ["tud-stadtmitte", "tud-campus"])
def test_mot_full_frame_matches_the_clip_labels(shared_data: Path, clip: str) -> None:
    path = _clip(shared_data, clip)
    ds = mot_dataset(path, {"person_present": Polygon.parse(FULL)})
    assert ds.regions == {} and ds.roi("person_present") == FULL_FRAME  # not a polygon around the picture
    assert ds.n_frames == open_dataset(path).n_frames
    assert (ds.labels["person_present"] == 1).all()
    assert np.array_equal(ds.labels["person_present"], open_dataset(path).labels["person_present"])


def test_mot_region_counts_on_stadtmitte(stadtmitte: Path) -> None:
    ds = mot_dataset(stadtmitte, {"left": Polygon.parse(LEFT_THIRD), "top_half": Polygon.parse("0,0 1,0 1,0.5 0,0.5")})
    # SOURCE.md: 34 frames have nobody in the left third.
    assert int((ds.labels["left"] == 0).sum()) == 34
    assert int((ds.labels["left"] == 1).sum()) == 145
    # Some foot point is above the image's middle row (y + h < 240) on MOT frames 1..85 only (checked with awk).
    assert ds.intervals("top_half") == [(0, 84)]


def test_mot_people_who_walk_across_the_picture_edge_in_a_region(stadtmitte: Path) -> None:
    region = {"left": Polygon.parse("0,0.45 0.2,0.45 0.3,1 0,1")}
    crossings = edge_crossings(stadtmitte, region)["left"]
    # Hand-checked on drawn boxes: the woman in red walks out at the left edge after decoded frame 21 (half in view
    # at 22, a sliver at 24); the man in black walks in there, his legs in view from frame 130, his box from 133.
    assert [(c.track, c.frame, c.entering) for c in crossings] == [(1, 21, False), (10, 133, True)]
    plain, marked = mot_dataset(stadtmitte, region), mot_dataset(stadtmitte, region, edge_frames=4)
    changed = np.flatnonzero(plain.labels["left"] != marked.labels["left"])
    assert changed.tolist() == [22, 23, 24, 25, 129, 130, 131, 132]
    assert (marked.labels["left"][changed] == -1).all()
    assert edge_crossings(stadtmitte, {"top": Polygon.parse("0,0 1,0 1,0.2 0,0.2")}) == {"top": []}
    with pytest.raises(FilterForwardError, match="edge frames must be 0 or more"):
        mot_dataset(stadtmitte, region, edge_frames=-1)


def test_mot_region_counts_on_campus(campus: Path) -> None:
    right_quarter = Polygon.parse("0.75,0 1,0 1,1 0.75,1")
    ds = mot_dataset(campus, {"left": Polygon.parse(LEFT_THIRD), "right_quarter": right_quarter})
    assert int((ds.labels["left"] == 0).sum()) == 21  # SOURCE.md
    # Hand-checked on drawn boxes: person 1 leaves the right quarter after decoded frame 23 (MOT frame 24);
    # someone is there again from decoded frame 44; MOT frames 1-3 have nobody there.
    assert ds.intervals("right_quarter") == [(3, 23), (44, 70)]
    assert ds.roi("right_quarter") == ROI(x0=0.75, y0=0.0, x1=1.0, y1=1.0, polygon=right_quarter.root)


def test_export_mot_round_trips(campus: Path, tmp_path: Path) -> None:
    out = tmp_path / "campus-left"
    written = export_mot(campus, out, {"left": Polygon.parse(LEFT_THIRD)})
    config = yaml.safe_load((out / "dataset.yaml").read_text())
    assert config["video"] == str((campus / "TUD-Campus.mp4").resolve())
    assert config["events"] == ["left"]
    reopened = open_dataset(out)
    assert reopened.events() == ["left"]
    assert np.array_equal(reopened.labels["left"], written.labels["left"])
    assert reopened.regions["left"] == Polygon.parse(LEFT_THIRD)
    # Our n_persons column agrees with the one the clip's own derive_labels.py wrote.
    ours = np.loadtxt(out / "labels.csv", delimiter=",", skiprows=1, dtype=int)
    theirs = np.loadtxt(campus / "labels.csv", delimiter=",", skiprows=1, dtype=int)
    assert np.array_equal(ours[:, 3], theirs[:, 2])
    with pytest.raises(FilterForwardError, match="already holds"):
        export_mot(campus, out)


def test_mot_classes_flags_and_image_folder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "MOT17-XX"
    _write_images(root / "img1", 5, size=(100, 80))
    (root / "seqinfo.ini").write_text(
        "[Sequence]\nname=MOT17-XX\nimDir=img1\nframeRate=30\nseqLength=5\nimWidth=100\nimHeight=80\nimExt=.png\n"
    )
    (root / "gt").mkdir()
    # frame,id,x,y,w,h,flag,class,visibility; foot points at x = 20 (left half) or 80 (right half).
    rows = [
        "1,1,10,10,20,40,1,1,1.0",  # pedestrian, counted -> 1
        "2,1,10,10,20,40,0,1,1.0",  # pedestrian with flag 0 -> ignored -> uncertain
        "3,2,10,10,20,40,0,3,1.0",  # a car -> 0
        "4,3,10,10,20,40,0,7,1.0",  # static person (distractor) on the left -> uncertain
        "4,1,70,10,20,40,1,1,1.0",  # a counted pedestrian on the right
        "5,1,10,10,20,40,1,1,1.0",  # counted beats a distractor in the same place
        "5,3,10,10,20,40,0,8,1.0",
    ]
    (root / "gt" / "gt.txt").write_text("\n".join(rows) + "\n")
    ds = mot_dataset(root, {"left": Polygon.parse("0,0 0.5,0 0.5,1 0,1")})
    assert ds.source == root / "img1" and ds.fps == 30 and ds.frame_size == (100, 80)
    assert ds.labels["left"].tolist() == [1, -1, 0, -1, 1]
    assert mot_dataset(root).labels["person_present"].tolist() == [1, -1, 0, 1, 1]
    for name in ("seqinfo.ini", "gt/gt.txt"):  # saved by a Windows editor: a byte-order mark first
        (root / name).write_text("\ufeff" + (root / name).read_text(), encoding="utf-8")
    assert mot_dataset(root).labels["person_present"].tolist() == [1, -1, 0, 1, 1]
    # An image missing from img1 shifted every later frame's labels onto the next image: refused.
    (root / "img1" / "f3.png").unlink()
    with pytest.raises(FilterForwardError, match=r"img1 has f4.png as its image 3: MOT names them 1, 2, 3"):
        mot_dataset(root)
    _write_images(root / "img3", 1)
    (root / "img3" / "f1.png").rename(root / "img1" / "f3.png")
    # The same boxes with two columns more: not read as MOT15's layout (every box a pedestrian, the car counted).
    (root / "gt" / "gt.txt").write_text("\n".join(row + ",0,0" for row in rows) + "\n")
    with pytest.raises(FilterForwardError, match=r"gt.txt has 11 columns: MOT ground truth has 9 \(MOT16/17/20"):
        mot_dataset(root)
    # Ground truth that is not numbers, or not as many on every line, is told by its 1-based line.
    for text, message in [
        ("\n".join(rows[:2]) + "\n3,2,10\n", r"gt.txt line 3 has 3 fields where the lines before have 9"),
        (rows[0] + "\n\n2,1,a,10,20,40,0,1,1.0\n", r"gt.txt line 3 is '2,1,a,10.*comma-separated numbers"),
        (rows[0].replace("10,10", "nan,10", 1) + "\n", r"gt.txt line 1 is '1,1,nan"),
    ]:
        (root / "gt" / "gt.txt").write_text(text)
        with pytest.raises(FilterForwardError, match=message):
            mot_dataset(root)
    (root / "gt" / "gt.txt").write_text("\n".join(rows) + "\n")
    seqinfo = (root / "seqinfo.ini").read_text()
    # A size of 0 divided by zero into labels without a word; a wrong one placed every box wrong.
    (root / "seqinfo.ini").write_text(seqinfo.replace("imWidth=100", "imWidth=0"))
    with pytest.raises(FilterForwardError, match=r"seqinfo.ini has imWidth=0: each must be a positive number"):
        mot_dataset(root)
    (root / "seqinfo.ini").write_text(seqinfo.replace("imWidth=100", "imWidth=20"))
    with caplog.at_level(logging.WARNING, logger="models.datasets.mot"):
        mot_dataset(root)
    assert "says 20x80, the frames decode at 100x80" in caplog.text
    assert "1 of 7 boxes have their foot point outside the 20x80 image" in caplog.text
    (root / "seqinfo.ini").write_text("garbage[[\n")  # configparser's message spans three lines
    with pytest.raises(FilterForwardError, match=r"seqinfo.ini is incomplete \(File contains no section") as info:
        mot_dataset(root)
    assert "\n" not in str(info.value)


# --- the format -----------------------------------------------------------------------------------


def test_image_folder_dataset_with_declared_events(tmp_path: Path) -> None:
    labels = "frame_index,a,count\n0,1,5\n1,0,3\n2,-1,2\n3,1,1\n"
    root = _image_dataset(tmp_path / "ds", labels, "name: tiny\nimages: frames\nfps: 10\nevents: [a]\n")
    ds = open_dataset(root)
    assert (ds.name, ds.n_frames, ds.fps, ds.frame_size) == ("tiny", 12, 10.0, (64, 48))
    assert ds.labels["a"].tolist() == [1, 0, -1, 1] + [-1] * 8  # frames without a row are uncertain
    # f2.png comes before f10.png: frame i is the image with value 10*i.
    assert [int(image[0, 0, 0]) for _, image in ds.frames()] == [10 * i for i in range(12)]
    assert ds.intervals("a") == [(0, 0), (3, 3)]


def test_a_video_damaged_part_way_is_said_to_be(
    tmp_path: Path, scratch_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Decoding stops at the first damaged frame: the warning says so, where only the labels past the end (the
    next warning) were blamed before."""
    video = write_synthetic(tmp_path / "good", n_frames=60, size=(128, 96), seed=1).source
    data = bytearray(video.read_bytes())
    middle, span = len(data) // 2, len(data) // 10
    data[middle : middle + span] = bytes(span)  # 10% of the file overwritten in its middle
    root = tmp_path / "damaged"
    root.mkdir()
    (root / "clip.mp4").write_bytes(bytes(data))
    (root / "labels.csv").write_text("frame_index,a\n" + "".join(f"{i},{i % 2}\n" for i in range(60)))
    with caplog.at_level(logging.WARNING, logger="models.datasets.frames"):
        dataset = open_dataset(root)
    assert dataset.n_frames < 54
    assert f"only {dataset.n_frames} of the 60 frames its container states decode: the video is damaged" in caplog.text


def test_a_column_of_labels_with_a_stray_value_is_said_to_be_no_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    labels = "frame_index,a,b\n" + "".join(f"{i},{i % 2},{'' if i == 7 else 1}\n" for i in range(12))
    with caplog.at_level(logging.WARNING, logger="models.datasets.labelled"):
        dataset = open_dataset(_image_dataset(tmp_path / "ds", labels))
    assert dataset.events() == ["a"]  # b was left out silently
    assert "column 'b' is no event: it holds '' on frame 7 (an event's values are 1, 0 and -1)" in caplog.text


def test_rows_past_the_video_are_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    labels = "\ufeffframe_index,a\n" + "".join(f"{i},1\n" for i in range(1, 14))  # 1-based by mistake, BOM
    ds = open_dataset(_image_dataset(tmp_path / "ds", labels))
    assert ds.labels["a"].tolist() == [-1] + [1] * 11
    assert "2 rows are past the last of the 12 decoded frames" in caplog.text


def test_the_camera_frame_column_says_which_frames_follow_each_other(tmp_path: Path) -> None:
    # Footage every other camera frame (0, 2, 4), then frames 9 and 10; frame 5 has no row. Its 0/1 values alone
    # would pass for an event column: camera_frame never does.
    labels = "frame_index,a,camera_frame\n0,1,0\n1,1,1\n2,0,4\n3,0,9\n4,1,10\n6,1,11\n7,0,12\n"
    ds = open_dataset(_image_dataset(tmp_path / "ds", labels))
    assert ds.events() == ["a"]
    assert ds.camera_frames.tolist() == [0, 1, 4, 9, 10, -1, 11, 12] + [-1] * 4
    assert ds.consecutive(0, 8).tolist() == [False, True, False, False, True, False, False, True]
    assert ds.consecutive(4, 7).tolist() == [False, False, False]
    plain = open_dataset(_image_dataset(tmp_path / "plain", "frame_index,a\n0,1\n"))
    assert plain.camera_frames is None and plain.consecutive(2, 5).tolist() == [False, True, True]
    with pytest.raises(FilterForwardError, match="not allowed"):
        check_event_name("camera_frame")
    bad = _image_dataset(tmp_path / "bad", "frame_index,a,camera_frame\n0,1,0\n1,1,x\n")
    with pytest.raises(FilterForwardError, match=r"camera_frame 'x' of frame 1 is not a whole number") as info:
        open_dataset(bad)
    assert "\n" not in str(info.value)


def test_uncertain_frames_do_not_split_an_event() -> None:
    labels = {"e": np.array([0, 1, -1, 1, 0, 1, -1, -1, 0, -1], dtype=np.int8)}
    ds = LabelledDataset(Path("."), "x", Path("x.mp4"), 10.0, (64, 48), 10, labels)
    assert ds.intervals("e") == [(1, 3), (5, 5)]


def test_blank_looking_lines_of_labels_csv_are_skipped(tmp_path: Path) -> None:
    """A line of spaces was refused as a row of one field, and a spreadsheet's empty row (",") for its frame_index."""
    root = _image_dataset(tmp_path / "src", "frame_index,a\n0,1\n  \n,\n1,0\n\n2,1\n")
    assert open_dataset(root).labels["a"][:4].tolist() == [1, 0, 1, -1]


def test_write_labelled_keeps_extra_columns_out_of_the_events(tmp_path: Path) -> None:
    root = _image_dataset(tmp_path / "src", "frame_index,a\n0,1\n1,1\n2,0\n")
    out = write_labelled(open_dataset(root), tmp_path / "out", extra_columns={"n": np.ones(12, dtype=int)})
    assert out.events() == ["a"] and out.source == (root / "frames").resolve()
    assert (tmp_path / "out" / "labels.csv").read_text().splitlines()[:2] == ["frame_index,a,n", "0,1,1"]


@pytest.mark.parametrize(
    ("labels", "config", "message"),
    [
        ("frame_index,a\n0,1\n1,2\n", "fps: 10\nevents: [a]\n", r"event 'a' has value '2' on frame 1; event"),
        ("frame_index,a\n0,1\n1.5,0\n", "fps: 10\n", r"line 3: frame_index '1.5' is not a whole number"),
        ("frame_index,a\n0,1\n" + "9" * 23 + ",0\n", "fps: 10\n", r"line 3: frame_index '9+' is far past any"),
        ("frame_index,a\n0,1\n1_0,0\n", "fps: 10\n", r"line 3: frame_index '1_0' is not a whole number"),
        ("frame_index,a\n0,1\n\u0663,0\n", "fps: 10\n", r"line 3: frame_index '\u0663' is not a whole number"),
        # Blank lines counted: the line said is the file's (it said row 3 for line 6).
        ("frame_index,a\n0,1\n\n  \n,\n1.5,0\n", "fps: 10\n", r"line 6: frame_index '1.5' is not"),
        ("frame_index,a\n0,1\n", "fps: .inf\n", r"fps: Input should be a finite number"),
        ("frame_index,a\n0,1\n", "fps: .nan\n", r"fps: Input should be a finite number"),
        ("frame_index,a\n0,1\n0,0\n", "fps: 10\n", "lists frame 0 twice"),
        ("frame_index,a\n-1,1\n", "fps: 10\n", "negative frame_index"),
        ("frame_index,a\n12,1\n40,0\n", "fps: 10\n", r"labels frames 12 to 40, but the video has 12 \(0 to 11\)"),
        ("frame,a\n0,1\n", "fps: 10\n", "first column is 'frame_index'"),
        ("frame_index,a\n0,1,3\n", "fps: 10\n", "line 2 has 3 fields"),
        ("frame_index,count\n0,7\n", "fps: 10\n", r"no event column \(.*; 'count' holds '7' on frame 0\)"),
        ("frame_index,car\n0,1\n1,yes\n", "fps: 10\n", "'car' holds 'yes' on frame 1"),
        # The column meant as the event is named, not a count column before it (which was).
        ("frame_index,mot_frame,car\n0,1,1\n1,2,0\n2,3,\n3,4,1\n", "fps: 10\n", "'car' holds '' on frame 2\\)"),
        ("frame_index;car\n0;1\n", "fps: 10\n", r"\(it starts 'frame_index;car'\); separate columns with commas"),
        ("", "fps: 10\n", r"first column is 'frame_index' \(it is empty\)"),
        ("frame_index,a\n0,1\n", "fps: 10\nevents: [b]\n", r"lacks the event columns \['b'\]"),
        ("frame_index,a\n0,1\n", "fps: 10\ncolour: red\n", "invalid at colour"),
        ("frame_index,a\n0,1\n", "fps: [10\n", "not valid YAML"),
        # YAML keeps the last of two: 30 fps was read without a word.
        ("frame_index,a\n0,1\n", "fps: 25\nfps: 30\n", r"dataset\.yaml: key 'fps' is given twice \(lines 1 and 2\)"),
        ("frame_index,a\n0,1\n", "fps: 10\nregions:\n  a: {x0: 0, x0: 1}\n", "key 'x0' is given twice"),
        ("frame_index,a\n0,1\n", "{}\n", "set `fps:` in dataset.yaml"),
        ("frame_index,a\n0,1\n", "fps: 10\nregions: {b: {x0: 0, y0: 0, x1: 1, y1: 1}}\n", "no events"),
        ("frame_index,a\n0,1\n", "fps: 10\nregions: {a: {polygon: [[0, 0], [1, 1], [1, 0], [0, 1]]}}\n", "crosses"),
        ("frame_index,a\n0,1\n", "fps: 10\nregions: {a: [[0, 0], [1, 1], [1, 0], [0, 1]]}\n", "crosses itself"),
        ("frame_index,a\n0,1\n", "fps: 10\nregions: {a: [[0, 0], [2, 0], [1, 1]]}\n", "'a': polygon points must"),
        ("frame_index,a\n0,1\n", "fps: 10\nregions: {a: 7}\n", "region of 'a' is 7: give a box"),
        ("frame_index,a\n0,1\n", "fps: 10\nregions: {a: {x0: 2}}\n", r"region of 'a' \(x0\): Input should be less"),
        ("frame_index,a\n0,1\n", "fps: 10\nimages: nowhere\n", "does not exist"),
        # A forgotten corner would have been the frame's edge, YAML's `true` 1 fps, a reserved name an event.
        ("frame_index,a\n0,1\n", "fps: 10\nregions: {a: {x0: 0.1, y0: 0.1, x1: 0.5}}\n", "region of 'a' lacks y1"),
        ("frame_index,a\n0,1\n", "fps: true\n", "invalid at fps: Input should be a valid number"),
        ("frame_index,a\n0,1\n", "fps: 10\nevents: [camera_frame]\n", "event name 'camera_frame' is not allowed"),
        ("frame_index,a\n0,1\n", "fps: 10\nevents: [a, a]\n", "event 'a' is listed twice"),
        ("frame_index,a\n0,1\n", "fps: 10\nevents: []\n", r"dataset.yaml lists no events \(events: \[\]\)"),
        # A column's name would become a bundle's folder: '../../x' wrote one outside --out.
        ("frame_index,../../x\n0,1\n", "fps: 10\n", r"labels\.csv: event name '\.\./\.\./x' is not allowed.*rename"),
        ("frame_index,,a\n0,1,0\n", "fps: 10\n", r"event name '' is not allowed"),
    ],
)
def test_bad_dataset_folders_are_reported(tmp_path: Path, labels: str, config: str, message: str) -> None:
    root = _image_dataset(tmp_path / "ds", labels, config)
    with pytest.raises(FilterForwardError, match=message) as info:
        open_dataset(root)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("config", "event", "reason"),
    [
        ("fps: 10\n", "b", " (its labels.csv column holds '2' on frame 1: an event's values are 1, 0 and -1)"),
        ("fps: 10\nevents: [a]\n", "c", " (labels.csv has the column, but dataset.yaml's events: does not list it)"),
        ("fps: 10\n", "d", ""),
    ],
    ids=["a value that is no label", "not listed", "no such column"],
)
def test_an_event_asked_for_that_is_not_one_says_why(tmp_path: Path, config: str, event: str, reason: str) -> None:
    """A column with one bad value is a data column, not an event: asking for it by name says so."""
    dataset = open_dataset(_image_dataset(tmp_path / "ds", "frame_index,a,b,c\n0,1,0,1\n1,0,2,0\n", config))
    with pytest.raises(FilterForwardError) as info:
        dataset.require_event(event)
    assert str(info.value) == f"dataset ds has no event {event!r}{reason}; its events are {', '.join(dataset.events())}"


def test_files_that_are_not_utf8_are_reported(tmp_path: Path) -> None:
    root = _image_dataset(tmp_path / "ds", "frame_index,a\n0,1\n")
    (root / "labels.csv").write_bytes(b"frame_index,a\n0,1\n1,\xe9t\xe9\n")  # Latin-1 from a spreadsheet
    with pytest.raises(FilterForwardError, match=r"labels\.csv is not UTF-8 text \(byte 0xe9 on line 3\)"):
        open_dataset(root)
    (root / "labels.csv").write_text("frame_index,a\n0,1\n")
    (root / "dataset.yaml").write_bytes(b"name: caf\xe9\nfps: 10\n")
    with pytest.raises(FilterForwardError, match=r"dataset\.yaml is not UTF-8 text"):
        open_dataset(root)


def test_missing_folder_and_missing_labels(tmp_path: Path) -> None:
    with pytest.raises(FilterForwardError, match="does not exist"):
        open_dataset(tmp_path / "nope")
    (tmp_path / "a-file").write_text("frame_index\n")
    with pytest.raises(FilterForwardError, match=r"a-file is a file, not a folder: give a folder holding labels\.csv"):
        open_dataset(tmp_path / "a-file")
    _write_images(tmp_path / "bare" / "frames", 2)
    with pytest.raises(FilterForwardError, match=r"has no labels\.csv"):
        open_dataset(tmp_path / "bare")


def test_mot_folder_without_labels_points_at_the_converter(campus: Path, tmp_path: Path) -> None:
    copy = tmp_path / "campus"
    shutil.copytree(campus, copy, ignore=shutil.ignore_patterns("labels.csv"))
    with pytest.raises(FilterForwardError, match="filterforward dataset mot"):
        open_dataset(copy)


def test_frame_sources_must_be_unambiguous(tmp_path: Path) -> None:
    root = _image_dataset(tmp_path / "ds", "frame_index,a\n0,1\n")
    _write_images(root / "more", 2)
    (root / "dataset.yaml").unlink()
    with pytest.raises(FilterForwardError, match=r"several frame sources \(frames, more\)"):
        open_dataset(root)
    shutil.rmtree(root / "frames")
    shutil.rmtree(root / "more")
    with pytest.raises(FilterForwardError, match="holds no frames"):
        open_dataset(root)
    # What the user sees there is named, not "add a video": a video.mp4 whose link is broken, a folder named as one.
    (root / "video.mp4").symlink_to("/nonexistent/v.mp4")
    with pytest.raises(FilterForwardError, match=r"holds no frames: video.mp4 is a link to /nonexistent/v.mp4, which"):
        open_dataset(root)
    (root / "dataset.yaml").write_text("fps: 10\nvideo: .\n")
    with pytest.raises(FilterForwardError, match=r"names video file .*, which is a folder: fix the path"):
        open_dataset(root)


def test_a_video_that_does_not_decode(tmp_path: Path) -> None:
    (tmp_path / "video.mp4").write_text("this is not a video\n")
    (tmp_path / "labels.csv").write_text("frame_index,a\n0,1\n")
    with pytest.raises(FilterForwardError, match=r"video.mp4 cannot be opened as a video|no frame of .* decodes"):
        open_dataset(tmp_path)


def test_images_of_different_sizes(tmp_path: Path) -> None:
    root = _image_dataset(tmp_path / "ds", "frame_index,a\n0,1\n")
    cv2.imwrite(str(root / "frames" / "f5.png"), np.zeros((10, 10, 3), dtype=np.uint8))
    with pytest.raises(FilterForwardError, match=r"f5\.png is 10x10"):
        list(open_dataset(root).frames())


def test_an_empty_or_broken_image_is_named_not_a_traceback(tmp_path: Path) -> None:
    root = _image_dataset(tmp_path / "ds", "frame_index,a\n0,1\n")
    for damage in (b"", b"not a png"):  # an empty file made OpenCV's imdecode assert
        (root / "frames" / "f5.png").write_bytes(damage)
        with pytest.raises(FilterForwardError, match=r"f5\.png is not a readable image: replace or remove it"):
            list(open_dataset(root).frames())


def test_frame_count_is_what_decodes_not_what_the_container_says(tmp_path: Path) -> None:
    whole = tmp_path / "whole.avi"
    writer = cv2.VideoWriter(str(whole), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for i in range(30):
        writer.write(np.full((48, 64, 3), 8 * i, dtype=np.uint8))
    writer.release()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 6 // 10])  # the header still says 30 frames
    assert int(cv2.VideoCapture(str(cut), cv2.CAP_FFMPEG).get(cv2.CAP_PROP_FRAME_COUNT)) == 30
    info = probe(cut)
    assert 0 < info.n_frames < 30
    assert len(list(read_frames(cut))) == info.n_frames
    assert probe(cut).n_frames == info.n_frames  # second time from the cache
    assert probe(whole).n_frames == 30


# --- polygons -------------------------------------------------------------------------------------


def test_polygon_contains_and_bbox() -> None:
    triangle = Polygon.parse("0,0; 1,1; 0,1")
    inside = triangle.contains(np.array([0.1, 0.9, 0.5, 0.0]), np.array([0.9, 0.1, 0.75, 0.5]))
    assert inside.tolist() == [True, False, True, True]
    assert triangle.bbox() == ROI(x0=0, y0=0, x1=1, y1=1)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0,0 1,1", "at least 3 points"),
        ("a,b c,d e,f", "not numbers"),
        ("0,0 2,0 2,2", "normalised coordinates"),
        ("0,0 0.5,0.5 1,1", "no area"),
        ("0,0,0 1,0 1,1", r"a point of 3 numbers, not x,y"),
        ("", "not numbers"),
    ],
)
def test_bad_polygons(text: str, reason: str) -> None:
    with pytest.raises(FilterForwardError, match=reason) as info:
        Polygon.parse(text)
    assert "e.g. '0,0.5 1,0.5 1,1 0,1'" in str(info.value)


# --- CLI ------------------------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="filterforward")
    dataset_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_cli_info_and_mot(campus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("dataset", "info", str(campus)) == 0
    assert "person_present" in capsys.readouterr().out
    out = tmp_path / "left"
    assert _cli("dataset", "mot", str(campus), "--event", f"left={LEFT_THIRD}", "--out", str(out)) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("left "))
    assert row.split()[:5] == ["left", "50", "21", "0", "2"]
    assert open_dataset(out).events() == ["left"]


def test_cli_mot_notes_and_marks_walks_across_the_picture_edge(
    stadtmitte: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    event = "left=0,0.45 0.2,0.45 0.3,1 0,1"
    assert _cli("dataset", "mot", str(stadtmitte), "--event", event, "--out", str(tmp_path / "a")) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note.startswith("note: left: 2 people walk in or out across the picture's edge") and "21 out, 133 in" in note
    assert note.endswith("--edge-frames 8 marks a third of a second of them uncertain")  # 25 fps
    out = tmp_path / "b"
    assert _cli("dataset", "mot", str(stadtmitte), "--event", event, "--out", str(out), "--edge-frames", "8") == 0
    assert capsys.readouterr().out.endswith("so the 8 frames before (after) each are uncertain\n")
    assert int((open_dataset(out).labels["left"] == -1).sum()) == 16
    with pytest.raises(FilterForwardError, match="edge frames must be 0 or more"):
        _cli("dataset", "mot", str(stadtmitte), "--out", str(tmp_path / "c"), "--edge-frames", "-2")
    assert not (tmp_path / "c").exists()


def test_cli_info_on_a_bare_mot_sequence(campus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "campus"
    shutil.copytree(campus, copy, ignore=shutil.ignore_patterns("labels.csv"))
    assert _cli("dataset", "info", str(copy)) == 0
    assert "TUD-Campus" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ("left", "lacks '='"),
        ("left=0,0 1,1", "does not parse"),
        ("frame_index=" + FULL, "not allowed"),
        ("n_persons=" + FULL, "event 'n_persons' has the name of a column labels.csv holds besides the events"),
    ],
)
def test_cli_mot_bad_events(campus: Path, tmp_path: Path, event: str, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message):
        _cli("dataset", "mot", str(campus), "--event", event, "--out", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_cli_mot_out_must_be_a_folder(campus: Path, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("keep me\n")
    with pytest.raises(FilterForwardError, match="a-file is a file, not a folder: give a folder path"):
        _cli("dataset", "mot", str(campus), "--event", "left=" + FULL, "--out", str(tmp_path / "a-file"))
    assert (tmp_path / "a-file").read_text() == "keep me\n"


def test_cli_mot_needs_a_mot_folder(tmp_path: Path) -> None:
    with pytest.raises(FilterForwardError, match=r"no seqinfo\.ini"):
        _cli("dataset", "mot", str(tmp_path), "--out", str(tmp_path / "x"))
    (tmp_path / "seq.txt").write_text("not a sequence\n")
    with pytest.raises(FilterForwardError, match=r"seq\.txt is a file, not a folder: give the folder with seqinfo"):
        _cli("dataset", "mot", str(tmp_path / "seq.txt"), "--out", str(tmp_path / "x"))


def test_an_image_folder_of_two_sizes_is_refused_in_any_range(tmp_path: Path) -> None:
    """The dataset's size is its first image's: a range read later whose images share another size is refused too,
    not trained on as if it were that size."""
    _write_images(tmp_path / "a", 3, size=(64, 48))
    _write_images(tmp_path / "b", 3, size=(80, 48))
    for n, image in enumerate(sorted((tmp_path / "b").iterdir()), start=4):
        image.rename(tmp_path / "a" / f"f{n}.png")
    assert probe(tmp_path / "a", fps=10).frame_size == (64, 48)
    with pytest.raises(FilterForwardError, match=r"f4.png is 80x48, unlike f1.png \(64x48\): all images of a"):
        list(read_frames(tmp_path / "a", 3, 6))
    assert len(list(read_frames(tmp_path / "a", 0, 3))) == 3
