"""Synthetic labelled scenes: the video, determinism, event statistics, and labels checked against pixels."""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
import sys
import termios
from pathlib import Path

import av
import numpy as np
import pytest

from filterforward.commands import dataset as dataset_command
from models.datasets import LabelledDataset, open_dataset, write_synthetic
from models.datasets.synth import EVENTS, REGION, label_event, plan_tracks
from models.errors import FilterForwardError

N_FRAMES = 600
SIZE = (320, 192)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def scratch_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FILTERFORWARD_CACHE", str(cache))


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> LabelledDataset:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FILTERFORWARD_CACHE", str(cache))
        return write_synthetic(tmp_path_factory.mktemp("synth") / "scene", n_frames=N_FRAMES, size=SIZE, seed=7)


@pytest.fixture(scope="module")
def pixels(scene: LabelledDataset) -> np.ndarray:
    return np.stack([image for _, image in scene.frames()])


def test_the_folder_is_a_labelled_dataset(scene: LabelledDataset) -> None:
    reopened = open_dataset(scene.root)
    assert (reopened.n_frames, reopened.fps, reopened.frame_size) == (N_FRAMES, 15.0, SIZE)
    assert reopened.events() == list(EVENTS)  # n_objects is information, not an event
    assert reopened.roi("red_in_region") == REGION
    assert "n_objects" in (scene.root / "labels.csv").read_text().splitlines()[0]
    with av.open(str(scene.root / "video.mp4")) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")


def test_events_recur_through_the_clip(scene: LabelledDataset) -> None:
    for event in EVENTS:
        values = scene.labels[event]
        assert 0.08 <= (values == 1).mean() <= 0.5, event
        assert (values == -1).mean() < 0.1, event
        intervals = scene.intervals(event)
        # Enough separate occurrences to train on the first half and test on the second.
        assert sum(last < N_FRAMES // 2 for _, last in intervals) >= 1, event
        assert sum(first >= N_FRAMES // 2 for first, _ in intervals) >= 1, event
        assert len(intervals) >= 3, event


def test_events_imply_each_other(scene: LabelledDataset) -> None:
    anything = scene.labels["any_object"]
    for event in ("red_in_region", "blue_present"):
        assert (anything[scene.labels[event] == 1] == 1).all()
    assert ((anything == 1) & (scene.labels["red_in_region"] == 0) & (scene.labels["blue_present"] == 0)).any()


def test_blue_present_matches_the_pixels(scene: LabelledDataset, pixels: np.ndarray) -> None:
    blue, green, red = (pixels[..., c] for c in range(3))
    blue_pixels = ((blue > 150) & (red < 100) & (green < 150)).sum(axis=(1, 2))
    labels = scene.labels["blue_present"]
    # The smallest blue object, at least three quarters in view, covers several hundred pixels.
    assert blue_pixels[labels == 1].min() > 200
    assert blue_pixels[labels == 0].max() < 20


def test_red_in_region_matches_the_pixels(scene: LabelledDataset, pixels: np.ndarray) -> None:
    width, height = SIZE
    red_mask = (pixels[..., 2] > 150) & (pixels[..., 1] < 100) & (pixels[..., 0] < 100)
    checked = 0
    for index in np.flatnonzero(scene.labels["red_in_region"] != -1):
        ys, xs = np.nonzero(red_mask[index])
        in_region = (
            len(xs) > 100
            and REGION.x0 <= xs.mean() / width <= REGION.x1
            and REGION.y0 <= ys.mean() / height <= REGION.y1
        )
        assert in_region == (scene.labels["red_in_region"][index] == 1), f"frame {index}"
        checked += 1
    assert checked > 0.9 * N_FRAMES


def test_same_seed_same_clip(tmp_path: Path) -> None:
    def frames(dataset: LabelledDataset) -> np.ndarray:
        return np.stack([image for _, image in dataset.frames()])

    first, again, other = (
        write_synthetic(tmp_path / name, n_frames=120, size=(160, 96), seed=seed)
        for name, seed in (("first", 4), ("again", 4), ("other", 5))
    )
    for event in EVENTS:
        assert np.array_equal(again.labels[event], first.labels[event])
    assert np.array_equal(frames(again), frames(first))
    assert not np.array_equal(frames(other), frames(first))


def test_other_seeds_other_scenes() -> None:
    def labels(seed: int) -> np.ndarray:
        tracks = plan_tracks(N_FRAMES, SIZE, np.random.default_rng(seed))
        return label_event("any_object", tracks, N_FRAMES, SIZE)

    assert not np.array_equal(labels(1), labels(2))
    assert np.array_equal(labels(3), labels(3))


def test_the_background_drifts_in_brightness(scene: LabelledDataset, pixels: np.ndarray) -> None:
    empty = np.flatnonzero(scene.labels["any_object"] == 0)
    means = pixels[empty].mean(axis=(1, 2, 3))
    assert means.max() - means.min() > 10  # a few percent of global gain, not noise


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": (321, 192)}, "even numbers"),
        ({"size": (32, 32)}, "at least 64"),
        ({"n_frames": 0}, "0 frames asked for: give 1 to 100,000"),
        ({"n_frames": 100_000_001}, "give 1 to 100,000"),  # sat planning its tracks for minutes without a word
        ({"fps": 0.0}, "fps 0.0 does not work: give a frame rate from 1 to 240"),
        ({"fps": float("inf")}, "fps inf does not work"),  # an MP4's rate is a fraction: this crashed
        ({"fps": 1e-9}, "fps 1e-09 does not work"),  # ... and this wrote a 24 fps video
        ({"seed": -1}, "seed -1 does not work: give 0 or more"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message):
        write_synthetic(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_an_existing_dataset_is_kept_unless_overwritten(tmp_path: Path) -> None:
    first = write_synthetic(tmp_path, n_frames=30, size=(96, 64), seed=1)
    with pytest.raises(FilterForwardError, match=r"already holds video\.mp4.*overwrite them \(--force\)"):
        write_synthetic(tmp_path, n_frames=30, size=(96, 64), seed=2)
    assert open_dataset(tmp_path).name == first.name == "synthetic-1"
    assert write_synthetic(tmp_path, n_frames=20, size=(96, 64), seed=2, overwrite=True).n_frames == 20


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="filterforward")
    dataset_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_cli_synth_and_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert _cli("dataset", "synth", "--out", str(out), "--frames", "40", "--size", "128x96", "--seed", "5") == 0
    assert open_dataset(out).frame_size == (128, 96)
    capsys.readouterr()
    assert _cli("dataset", "info", str(out)) == 0
    printed = capsys.readouterr().out
    assert "frames    40 (2.7 s at 15 fps)" in printed
    assert all(event in printed for event in EVENTS)
    with pytest.raises(FilterForwardError, match="WIDTHxHEIGHT"):
        _cli("dataset", "synth", "--out", str(tmp_path / "x"), "--size", "128by96")
    (tmp_path / "a-file").write_text("keep me\n")
    with pytest.raises(FilterForwardError, match="a-file is a file, not a folder: give a folder path"):
        _cli("dataset", "synth", "--out", str(tmp_path / "a-file"), "--frames", "4")
    assert (tmp_path / "a-file").read_text() == "keep me\n"


def test_an_os_error_is_one_line_and_the_traceback_is_behind_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from filterforward.cli import main

    (tmp_path / "scene" / "labels.csv").mkdir(parents=True)  # in the way of the file synth writes there
    argv = ["dataset", "synth", "--out", str(tmp_path / "scene"), "--frames", "10", "--force"]
    assert main(argv) == 1
    error = capsys.readouterr().err.rstrip("\n")  # no progress bar: stderr is no terminal here
    in_the_way = tmp_path / "scene" / "labels.csv"
    assert error == f"filterforward dataset: error: {in_the_way}: Is a directory (-v shows where)"
    with pytest.raises(IsADirectoryError):
        main(["-v", *argv])


def test_progress_bars_show_on_a_terminal_only(tmp_path: Path) -> None:
    """A bar on a pipe or in a log file is one line of carriage returns growing with every update."""
    argv = [sys.executable, "-m", "filterforward", "dataset", "synth", "--frames", "12", "--size", "96x64"]
    piped = subprocess.run([*argv, "--out", str(tmp_path / "piped")], capture_output=True, text=True, check=True)
    assert "frame/s" not in piped.stderr and "\r" not in piped.stderr, piped.stderr
    controller, terminal = pty.openpty()
    termios.tcsetwinsize(terminal, (24, 100))  # a new pseudo-terminal is 0 columns wide: no room for a bar
    try:
        subprocess.run([*argv, "--out", str(tmp_path / "tty")], stderr=terminal, stdout=subprocess.DEVNULL, check=True)
        os.close(terminal)
        shown = _read_all(controller)
    finally:
        os.close(controller)
    assert "12/12" in shown and "frame/s" in shown, shown


def _read_all(fd: int) -> str:
    """What the other end of a pseudo-terminal wrote (reading it past the end raises EIO on Linux)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")
