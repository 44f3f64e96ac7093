"""Feature cache and single-process training on real synthetic clips, the real base DNN and ONNX Runtime."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from support import wait_until

from edge.mcbank import CameraState, MCBank
from filterforward.cli import main
from models.base_export import file_digest
from models.base_identity import identify
from models.basednn import BaseDNN
from models.bundle import check_mc_model, load_bundle
from models.cache import CacheUnusable, cache_dir
from models.coverage import one_place_warning
from models.crossval import FINAL_THRESHOLD
from models.datasets.labelled import LabelledDataset, open_dataset
from models.datasets.synth import write_synthetic
from models.errors import FilterForwardError
from models.evaluation import event_f1
from models.features import FEATURES_FILE, FeatureRequest, cache_key, cached_features
from models.mc_kinds import auto_context
from models.memory import GIB, check_memory
from models.microclassifiers import Ensemble, build_mc
from models.model_selection import DRAW_SEED_STEP, DRAWS, ENSEMBLE, best_draws
from models.roi import ROI
from models.smoother import smooth_scores
from models.stopping import TrainingStopped, request_stop, stop_requested, stoppable
from models.taps import EFFICIENTNET_LITE0_TAPS, PIXEL_TAP, default_input_size
from models.training import (
    BalancedSampler,
    Logits,
    TrainConfig,
    check_config,
    cross_validate,
    finish_training,
    fit_and_validate,
    fit_mc,
    fit_pool,
    load_training_data,
    make_optimizer,
    new_model,
    parse_curriculum,
    train_mc,
    train_steps,
    usable_cores,
)

TINY_SIZE = (128, 96)
CLIP_SIZE = (320, 192)
RIGHT_HALF = ROI(x0=0.5, y0=0.0, x1=1.0, y1=1.0)


@pytest.fixture(scope="module")
def tiny(feature_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> LabelledDataset:
    """48 frames at 128x96; seed 1 has positive, negative and uncertain frames of any_object early on."""
    return write_synthetic(tmp_path_factory.mktemp("tiny"), n_frames=48, size=TINY_SIZE, seed=1)


@pytest.fixture(scope="module")
def clip(feature_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> LabelledDataset:
    """480 frames at 320x192; seed 3 has several objects in both halves."""
    return write_synthetic(tmp_path_factory.mktemp("clip"), n_frames=480, size=CLIP_SIZE, seed=3)


@pytest.fixture(scope="module")
def clip_taps(clip: LabelledDataset, base_model: Path) -> dict[str, np.ndarray]:
    """Full-frame late and mid taps of every frame of the clip, from one pass of the base DNN."""
    requests = [FeatureRequest("late"), FeatureRequest("mid")]
    out = cached_features(clip, requests, CLIP_SIZE, None, base_model, progress=False)
    return {request.tap: array for request, array in out.items()}


def test_cached_features_are_the_base_dnn_taps_cropped(tiny: LabelledDataset, base_model: Path) -> None:
    requests = [FeatureRequest("mid", RIGHT_HALF), FeatureRequest("pixels")]
    out = cached_features(tiny, requests, TINY_SIZE, (10, 20), base_model, progress=False)
    assert out[requests[0]].shape == (10, 112, 6, 4)
    assert out[requests[1]].shape == (10, 3, 96, 128)
    assert out[requests[0]].dtype == np.float16

    ((_, frame),) = tiny.frames(13, 14)
    base = BaseDNN(TINY_SIZE, base_model)
    image = base.prepare(frame)
    mid = base.run(image, ["mid"])["mid"][0, :, :, 4:]
    np.testing.assert_allclose(out[requests[0]][3], mid, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(out[requests[1]][3], image.transpose(2, 0, 1) / 255.0, atol=1e-3)


def test_pixel_crops_do_not_depend_on_the_base_model(
    tiny: LabelledDataset, base_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    both = [FeatureRequest("mid"), FeatureRequest("pixels", RIGHT_HALF)]
    cached_features(tiny, both, TINY_SIZE, (0, 4), base_model, progress=False)
    with caplog.at_level(logging.DEBUG, logger="models.features"):
        cached_features(tiny, both[1:], TINY_SIZE, (0, 4), Path("/nonexistent.onnx"), progress=False)
    assert "feature cache hit" in caplog.text
    with pytest.raises(FilterForwardError, match=r"base model /nonexistent\.onnx does not exist"):
        cached_features(tiny, both[:1], TINY_SIZE, (0, 4), Path("/nonexistent.onnx"), progress=False)


def entry_array(dataset: LabelledDataset, request: FeatureRequest, input_size: tuple[int, int], model: Path):
    key = cache_key(dataset, request, input_size, file_digest(model))
    return np.load(cache_dir("features", key) / FEATURES_FILE, mmap_mode="r+")


CACHE_ON_A_FULL_DISK = """
import sys
from pathlib import Path
from models.datasets.labelled import open_dataset
from models.errors import FilterForwardError
from models.features import FeatureRequest, cached_features
dataset, model = open_dataset(sys.argv[1]), Path(sys.argv[2])
try:
    cached_features(dataset, [FeatureRequest("pixels")], (128, 96), None, model, progress=False)
except FilterForwardError as exc:
    print(exc)
"""


@contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `folder` (made), unmounted after; the test is skipped where mounting needs root."""
    folder.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]).returncode
    ):
        pytest.skip("mounting a small disk needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_feature_cache_on_a_full_disk_is_said_not_a_sigbus(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path
) -> None:
    """The sparse array's pages met the full disk only when written, and the kernel killed training with SIGBUS."""
    with small_disk(tmp_path / "disk", "1m") as disk:  # the 48 frames' pixels take 3.5 MB
        environment = {**os.environ, "FILTERFORWARD_CACHE": str(disk)}
        command = [sys.executable, "-c", CACHE_ON_A_FULL_DISK, str(tiny.root), str(base_model)]
        done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no room for the feature cache in " + str(disk / "features") in done.stdout, done.stdout
    assert "free space there or point FILTERFORWARD_CACHE at a disk with room" in done.stdout


def test_a_read_only_cache_serves_what_it_holds_and_says_why_it_cannot_add_more(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with small_disk(tmp_path / "disk", "16m") as disk:
        monkeypatch.setenv("FILTERFORWARD_CACHE", str(disk))
        request = [FeatureRequest("pixels")]
        cached_features(tiny, request, TINY_SIZE, (0, 4), base_model, progress=False)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        assert cached_features(tiny, request, TINY_SIZE, (0, 4), base_model, progress=False)[request[0]].shape[0] == 4
        with pytest.raises(CacheUnusable, match=r"cannot write the feature cache \(.*: Read-only file system\); point"):
            cached_features(tiny, request, TINY_SIZE, (0, 8), base_model, progress=False)


def test_second_call_is_served_from_the_cache(
    tiny: LabelledDataset, base_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    request = FeatureRequest("late")
    cached_features(tiny, [request], TINY_SIZE, (0, 8), base_model, progress=False)
    # Mark the cached values: only a cache hit can return the mark.
    array = entry_array(tiny, request, TINY_SIZE, base_model)
    array[2, 0, 0, 0] = 1234.0
    array.flush()
    with caplog.at_level(logging.DEBUG, logger="models.features"):
        again = cached_features(tiny, [request], TINY_SIZE, (0, 8), base_model, progress=False)
    assert again[request][2, 0, 0, 0] == 1234.0
    assert "feature cache hit" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="models.features"):
        wider = cached_features(tiny, [request], TINY_SIZE, (4, 12), base_model, progress=False)
    assert "of 4 frames" in caplog.text  # only frames 8..11 were missing
    assert wider[request][0].shape == (320, 3, 4)


def test_changed_video_is_not_served_stale_features(
    tmp_path: Path, base_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = write_synthetic(tmp_path, n_frames=6, size=TINY_SIZE, seed=5)
    request = FeatureRequest("early")
    cached_features(dataset, [request], TINY_SIZE, None, base_model, progress=False)
    stat = dataset.source.stat()
    os.utime(dataset.source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with caplog.at_level(logging.INFO, logger="models.features"):
        cached_features(dataset, [request], TINY_SIZE, None, base_model, progress=False)
    assert "of 6 frames" in caplog.text


def test_an_image_rewritten_in_place_is_not_served_stale_features(
    tmp_path: Path, base_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Copying new frames over old ones (ffmpeg -y images/%06d.png) leaves the folder's own mtime alone."""
    video = write_synthetic(tmp_path / "video", n_frames=4, size=TINY_SIZE, seed=5)
    root = tmp_path / "images"
    (root / "frames").mkdir(parents=True)
    for index, image in video.frames():
        cv2.imwrite(str(root / "frames" / f"{index:06d}.png"), image)
    (root / "frames" / "._000000.png").write_bytes(b"\0\5\26\7")  # macOS's metadata beside a copied image
    (root / "labels.csv").write_text("frame_index,a\n0,1\n1,0\n2,1\n3,0\n")
    (root / "dataset.yaml").write_text("fps: 10\n")
    dataset = open_dataset(root)
    assert dataset.n_frames == 4  # the hidden file is no frame
    request = FeatureRequest("early")
    before = cached_features(dataset, [request], TINY_SIZE, None, base_model, progress=False)[request].copy()
    folder_mtime = root.joinpath("frames").stat().st_mtime_ns
    cv2.imwrite(str(root / "frames" / "000002.png"), np.zeros_like(next(video.frames(2, 3))[1]))
    assert root.joinpath("frames").stat().st_mtime_ns == folder_mtime
    with caplog.at_level(logging.INFO, logger="models.features"):
        after = cached_features(dataset, [request], TINY_SIZE, None, base_model, progress=False)[request]
    assert "of 4 frames" in caplog.text
    assert not np.array_equal(before[2], after[2]) and np.array_equal(before[1], after[1])


def test_training_data_leaves_out_uncertain_frames(tiny: LabelledDataset, base_model: Path) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 20))
    data = load_training_data(tiny, config, base_model, progress=False)
    labels = tiny.labels["any_object"]
    assert (labels[:20] == -1).any()
    assert set(data.frames.tolist()) == set(np.flatnonzero(labels[:20] != -1).tolist())
    np.testing.assert_array_equal(data.targets, labels[data.frames] == 1)


def test_windowed_training_windows_start_with_zero_history(tiny: LabelledDataset, base_model: Path) -> None:
    config = TrainConfig(event="any_object", architecture="windowed", input_size=TINY_SIZE, frames=(2, 20), window=5)
    data = load_training_data(tiny, config, base_model, progress=False)
    assert data.first == 0  # the frames before the range are context, back to the start of the video
    windows, valid = data.inputs(np.array([0, 1, 9]))
    assert windows.shape == (3, 5, *data.crop_chw)
    np.testing.assert_array_equal(valid.numpy(), [[False] * 4 + [True], [False] * 3 + [True] * 2, [True] * 5])
    np.testing.assert_array_equal(windows[2].numpy(), np.asarray(data.features[5:10], dtype=np.float32))


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ((1920, 1080), (768, 448)),  # a 1080p camera's filters run at the edge's default size
        ((1280, 720), (768, 448)),
        ((3840, 2160), (768, 448)),
        ((768, 432), (768, 448)),  # small frames are only rounded
        ((640, 480), (640, 480)),
        ((100, 80), (96, 64)),
        ((1080, 1920), (448, 768)),  # portrait keeps its aspect
    ],
)
def test_the_default_input_size_is_the_frame_scaled_down_to_a_pixel_budget(
    frame: tuple[int, int], expected: tuple[int, int]
) -> None:
    assert default_input_size(frame) == expected


def test_balanced_batches_are_half_positive() -> None:
    frames = np.arange(100)
    targets = (frames % 10 == 0).astype(np.float32)  # 10% positive
    sampler = iter(BalancedSampler(frames, targets, 32, seed=7))
    for _ in range(5):
        batch, batch_targets = next(sampler)
        assert batch_targets.sum() == 16
        np.testing.assert_array_equal(targets[batch], batch_targets)
    again, _ = next(iter(BalancedSampler(frames, targets, 32, seed=7)))
    first, _ = next(iter(BalancedSampler(frames, targets, 32, seed=7)))
    np.testing.assert_array_equal(again, first)


def edge_scores(bundle: Path, features: np.ndarray, tap: str) -> np.ndarray:
    """Scores of a bundle run frame by frame by the edge's MC bank on full-frame taps."""
    spec, onnx_bytes = load_bundle(bundle)
    bank = MCBank(EFFICIENTNET_LITE0_TAPS, CLIP_SIZE)
    bank.put(spec, onnx_bytes)
    state, mcs = CameraState(), bank.active("cam")
    image = np.zeros((CLIP_SIZE[1], CLIP_SIZE[0], 3), np.uint8)
    return np.array([bank.score(mcs, {tap: f[None].astype(np.float32)}, image, state)[spec.name] for f in features])


@pytest.mark.parametrize("architecture", ["full_frame", "localized", "windowed"])
def test_training_learns_the_event_on_held_out_frames(
    clip: LabelledDataset, clip_taps: dict[str, np.ndarray], base_model: Path, tmp_path: Path, architecture: str
) -> None:
    event = "any_object"  # an object of any colour or shape: each half of the clip has several
    config = TrainConfig(event=event, architecture=architecture, input_size=CLIP_SIZE, frames=(0, 240), steps=150)
    result = train_mc(clip, config, tmp_path / "bundle", base_model, progress=False)
    assert result.train_scores.f1 > 0.9

    # Held out: the second half, scored the way the edge scores a stream (from frame 0, windowed state).
    scores = edge_scores(result.bundle, clip_taps[config.tap_name], config.tap_name)[240:]
    labels = clip.labels[event][240:]
    smoothing = result.spec.smoothing
    held_out = event_f1(labels, smooth_scores(scores, smoothing.threshold, smoothing.k, smoothing.n)).f1
    always = event_f1(labels, np.ones(len(labels), bool)).f1  # chance: send every frame
    assert held_out > 0.85
    assert held_out > always + 0.25


def test_discrete_baseline_trains_on_pixels(tiny: LabelledDataset, base_model: Path, tmp_path: Path) -> None:
    config = TrainConfig(event="any_object", architecture="discrete", input_size=TINY_SIZE, frames=(0, 48), steps=5)
    result = train_mc(tiny, config, tmp_path, base_model, progress=False)
    spec, onnx_bytes = load_bundle(result.bundle)
    assert spec.tap == "pixels" and spec.base_model is None  # pixels are the same on any base model
    check_mc_model(spec, onnx_bytes, PIXEL_TAP.shape(TINY_SIZE))


def test_cli_trains_and_summarises(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["train", str(tiny.root), "--event", "blue_present", "--arch", "localized", "--roi", "0,0,0.5,1"]
    argv += ["--frames", "0:40", "--steps", "20", "--base-model", str(base_model), "--out", str(tmp_path / "b")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "filter blue_present-localized: localized on tap mid, region box 0,0,0.5,1, at 128x96" in out
    assert "trained on frames 0:40" in out
    assert "on its own training frames: event F1" in out
    spec, _ = load_bundle(tmp_path / "b")
    assert spec.roi == ROI(x0=0, y0=0, x1=0.5, y1=1)
    assert 0 < spec.smoothing.threshold < 1


def test_cli_explains_bad_arguments(
    tiny: LabelledDataset, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FILTERFORWARD_CACHE", str(tmp_path / "cache"))  # no base-DNN features, so it stays away
    base = ["train", str(tiny.root), "--out", str(tmp_path)]
    assert main([*base, "--event", "any_object", "--roi", "0.5,0,0.2,1"]) == 2
    assert "region '0.5,0,0.2,1' is not valid (ROI needs x0 < x1" in capsys.readouterr().err
    assert main(base) == 2
    assert "several events" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--scales", "0.75,big"]) == 2
    assert "scales '0.75,big' are not comma-separated numbers, e.g. 0.75,1.25" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--arch", "localized", "--scales", "1.5"]) == 2
    expected = "training scales 1.5 need a full_frame MC, not localized: drop them or change the kind"
    assert expected in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--arch", "full_frame", "--scales", "0"]) == 2
    assert "training scales 0.0 are not all factors from 0.25 to 4" in capsys.readouterr().err
    for roi, reason in [("0.1,0.2,0.3", "a point of 3 numbers, not x,y"), ("", "not numbers 'x,y'")]:
        assert main([*base, "--event", "any_object", "--roi", roi]) == 2  # '' was ignored: the dataset's region
        assert f"region {roi!r} is not valid ({reason})" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--context", "9"]) == 2
    assert "--context '9' is not a number of cells: give 0 to 4" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--arch", "localized", "--context", "1"]) == 2
    expected = "a region's context cells are for a full_frame MC, not localized: drop --context or change the kind"
    assert expected in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--arch", "windowed", "--mirror"]) == 2
    expected = "mirrored training frames need a full_frame MC, not windowed: drop --mirror or change the kind"
    assert expected in capsys.readouterr().err
    # Each of these failed only after work (the cross-validation, the base DNN), or with a traceback.
    assert main([*base, "--event", "any_object", "--nproc", "0"]) == 2
    assert "--nproc must be at least 1, got 0" in capsys.readouterr().err
    for lr in ("nan", "-1", "0"):
        assert main([*base, "--event", "any_object", f"--lr={lr}"]) == 2
        assert f"the learning rate must be above 0 and at most 1, got {float(lr)}" in capsys.readouterr().err
    for option in ("--steps=100000000000", "--batch-size=100000"):  # an OOM kill without a word, or a traceback
        assert main([*base, "--event", "any_object", option]) == 2
        assert "need steps from 1 to 100,000, a batch size from 2 to 4096" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--arch", "windowed", "--window", "1"]) == 2
    assert "a windowed MC needs a window of at least 2 frames, got 1: raise --window" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--input-size", "100000x100000"]) == 2
    assert "input size 100000x100000 is not valid: each side must be at most 8192" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--input-size", "99999x99999"]) == 2  # suggested 100000x100000
    assert "input size 99999x99999 is not valid: each side must be at most 8192" in capsys.readouterr().err
    assert main([*base, "--event", "any_object", "--steps", "2"]) == 2  # the default filter trained 3, one a member
    assert "2 step(s) for an ensemble of 3 models (the default filter's): give --steps of at least 3" in (
        capsys.readouterr().err
    )
    for arch in ("full_frame", "auto"):  # kept in the spec, and it did nothing
        assert main([*base, "--event", "any_object", "--arch", arch, "--window", "3"]) == 2
        assert "--window is the frames a windowed MC stacks; full_frame reads one frame" in capsys.readouterr().err
    # Every --event is checked before the first is trained: a typo in the last one costs no work and writes nothing.
    assert main([*base, "--event", "any_object", "--event", "cars"]) == 2
    assert f"{tiny.name} has no event 'cars'; its events are " in capsys.readouterr().err
    # So are their labels: the last one's range without a positive frame refused the second, after the first's work.
    assert main([*base, "--event", "any_object", "--event", "red_in_region", "--frames", "0:16"]) == 2
    expected = "event 'red_in_region' has 0 positive and 16 negative frames in frames 0:16"
    assert expected in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["cache"]
    assert [path.name for path in (tmp_path / "cache").iterdir()] == ["frame-counts"]  # no features, no base model
    (tmp_path / "a-file").write_text("")
    assert main(["train", str(tiny.root), "--event", "any_object", "--out", str(tmp_path / "a-file")]) == 2
    assert "--out " + str(tmp_path / "a-file") + " is a file, not a folder" in capsys.readouterr().err


def test_a_range_without_both_labels_is_refused_before_the_base_dnn_runs(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default filter (both taps, cross-validation) finds out from the labels, not after caching features."""
    from models.model_selection import train_default

    monkeypatch.setenv("FILTERFORWARD_CACHE", str(tmp_path / "cache"))
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 5))
    with pytest.raises(FilterForwardError, match=r"has 0 positive and 5 negative frames in frames 0:5"):
        train_default(tiny, config, tmp_path / "out", base_model, progress=False)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_bad_training_requests_are_explained(tiny: LabelledDataset, base_model: Path, tmp_path: Path) -> None:
    def train(**changes: object) -> None:
        config = TrainConfig(
            **{"event": "any_object", "architecture": "full_frame", "input_size": TINY_SIZE, "steps": 1, **changes}
        )
        train_mc(tiny, config, tmp_path, base_model, progress=False)

    with pytest.raises(FilterForwardError, match="has no event 'cars'"):
        train(event="cars")
    with pytest.raises(FilterForwardError, match=r"0 positive .* pick a training range with both"):
        train(frames=(0, 5))
    with pytest.raises(FilterForwardError, match="frame range 40:60 is not inside the 48 frames"):
        train(frames=(40, 60))
    with pytest.raises(FilterForwardError, match="only the discrete baseline reads 'pixels'"):
        train(architecture="discrete", tap="mid")
    with pytest.raises(FilterForwardError, match="base model has no tap 'conv_pw_6'"):
        train(tap="conv_pw_6")
    with pytest.raises(FilterForwardError, match="unknown optimizer 'sgd'"):
        train(optimizer="sgd")
    with pytest.raises(FilterForwardError, match="filter spec would not be valid: name: String should match"):
        train(name="Cars In Lot")
    with pytest.raises(FilterForwardError, match="the seed must be 0 or more, got -3"):
        train(seed=-3)


def test_curricula_grow_the_window_and_resolution_seen_per_step(tiny: LabelledDataset, base_model: Path) -> None:
    window, resolution = "window:fixed_linear:1:4:6", "resolution:fixed_discrete:25,50,100:2,4"
    curricula = (parse_curriculum(window), parse_curriculum(resolution))
    config = TrainConfig(
        event="any_object", architecture="windowed", input_size=TINY_SIZE, frames=(0, 48), window=4, curricula=curricula
    )
    data = load_training_data(tiny, config, base_model, progress=False)
    model = new_model(config, data)
    seen: list[tuple[int, int]] = []  # per step: most frames of the window shown, distinct rows of the crop

    def record(_module: torch.nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
        windows, valid = inputs
        shown = int(valid.sum(dim=1).max())  # frames 0..2 lack history, the other samples show the most
        assert not valid[:, : valid.shape[1] - shown].any()  # only the most recent frames are shown
        seen.append((shown, torch.unique(windows[0, -1], dim=1).shape[1]))

    net = Logits(model)
    net.register_forward_pre_hook(record)
    optimizer = make_optimizer("adam", model.parameters(), 1e-3, 7, curricula)
    sampler = BalancedSampler(data.frames, data.targets, 16, seed=0)
    train_steps(net, data, optimizer, sampler, dataclasses.replace(config, steps=7), progress=False)
    # window ⌊3s/6⌋ + 1 = 1,2,2,3,3,4,4; rows of the 6-row crop: 25% (steps 1-2) -> 2, 50% (3-4) -> 3, 100% -> 6
    assert data.crop_chw[1] == 6
    assert seen == [(1, 2), (2, 2), (2, 3), (3, 3), (3, 6), (4, 6), (4, 6)]


def test_curricula_delay_the_variance_freeze_of_compressed_optimizers() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert make_optimizer("onebit_adam", params, 1e-3, 100).freeze_step == 20
    late = (parse_curriculum("window:fixed_discrete:2,5:30"), parse_curriculum("resolution:fixed_linear:50:100:10"))
    assert make_optimizer("onebit_adam", params, 1e-3, 100, late).freeze_step == 30 + 20
    assert make_optimizer("zeroone_adam", params, 1e-3, 100, late).var_freeze_step == 30 + 50


def test_cli_trains_one_mc_per_event_from_one_feature_pass(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["train", str(tiny.root), "--event", "blue_present", "--event", "any_object", "--arch", "full_frame"]
    argv += ["--frames", "0:40", "--steps", "10", "--base-model", str(base_model), "--out", str(tmp_path)]
    assert main(argv) == 0
    assert capsys.readouterr().out.count("bundle: ") == 2
    specs = [load_bundle(tmp_path / f"{event}-full_frame")[0] for event in ("blue_present", "any_object")]
    assert [spec.event for spec in specs] == ["blue_present", "any_object"]
    assert main([*argv, "--name", "one-name"]) == 2
    assert "--name names one filter" in capsys.readouterr().err
    # Bundles already there are replaced only when asked to, every one checked before the first is trained.
    for name in ("spec.json", "model.onnx"):
        (tmp_path / "blue_present-full_frame" / name).unlink()
    written = (tmp_path / "any_object-full_frame" / "model.onnx").stat().st_mtime_ns
    assert main(argv) == 2
    expected = f"{tmp_path / 'any_object-full_frame'} already holds a filter bundle (spec.json, model.onnx): give "
    assert expected + "another --out or replace it (--force)" in capsys.readouterr().err
    assert not any((tmp_path / "blue_present-full_frame").iterdir())  # the first event was not trained
    assert main([*argv, "--force"]) == 0
    assert (tmp_path / "any_object-full_frame" / "model.onnx").stat().st_mtime_ns != written


def test_each_events_bundle_folder_is_named_like_its_filter(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The default kind wrote OUT/<event>-auto, holding a filter named <event>-full_frame."""
    argv = ["train", str(tiny.root), "--event", "blue_present", "--event", "any_object", "--frames", "0:40"]
    argv += ["--base-model", str(base_model), "--out", str(tmp_path)]
    (tmp_path / "any_object-full_frame").mkdir()
    (tmp_path / "any_object-full_frame" / "spec.json").write_text("{}")
    assert main(argv) == 2  # refused before any training: the folder of the filter it would write is taken
    assert f"{tmp_path / 'any_object-full_frame'} already holds a filter bundle" in capsys.readouterr().err
    # Two events whose filter names are the same would write one folder twice.
    twin = tmp_path / "twin"
    shutil.copytree(tiny.root, twin)
    labels = (twin / "labels.csv").read_text().splitlines()
    column = labels[0].split(",").index("blue_present")
    rows = [",".join([*row.split(","), row.split(",")[column]]) for row in labels[1:]]
    (twin / "labels.csv").write_text("\n".join([labels[0] + ",Blue_Present", *rows]) + "\n")
    spec = (twin / "dataset.yaml").read_text()
    (twin / "dataset.yaml").write_text(spec.replace("any_object]", "any_object, Blue_Present]"))
    argv = ["train", str(twin), "--event", "blue_present", "--event", "Blue_Present", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    expected = "events blue_present, Blue_Present give filters of the same name: train them one --event at a time"
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_default_training_chooses_the_kind_by_cross_validation(
    clip: LabelledDataset, clip_taps: dict[str, np.ndarray], base_model: Path, tmp_path: Path, capsys
) -> None:
    argv = ["train", str(clip.root), "--event", "any_object", "--frames", "0:240", "--steps", "60"]
    assert main([*argv, "--base-model", str(base_model), "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    for tap in ("mid", "late"):
        assert re.search(rf"candidate full_frame on tap {tap}: held-out event F1 [01]\.\d{{3}} \(", out), out
    spec, _ = load_bundle(tmp_path / "b")
    assert spec.architecture == "full_frame" and spec.tap in ("mid", "late")
    assert spec.roi.context == auto_context(spec.input_size) >= 1  # its MCs read the cells around the region too
    assert spec.base_model == identify(base_model)  # the edge refuses it on any other base model
    validation = spec.validation
    assert validation is not None and validation.method == "occurrences" and validation.folds >= 2
    assert validation.f1_min <= validation.event_f1 <= validation.f1_max
    assert f"event F1 {validation.event_f1:.3f} (folds {validation.f1_min:.3f}-{validation.f1_max:.3f})" in out
    assert spec.smoothing.threshold == FINAL_THRESHOLD  # the final model's own class boundary, not the fold models'
    assert "k-of-n chosen on the held-out frames; the threshold is the model's own" in out
    # The synthetic objects move on every frame they are in: the filter needs motion in its region too.
    assert spec.motion is not None and 0 < spec.motion.min_foreground < 0.5
    assert f"motion veto: a frame counts only if {spec.motion.min_foreground:.2%} of the region's pixels" in out


def test_default_training_on_too_few_frames_to_validate_says_what_to_label(
    clip: LabelledDataset, clip_taps: dict[str, np.ndarray], base_model: Path, tmp_path: Path, capsys
) -> None:
    # Frames 15-17 are the only negatives before the first object's run (20-61): no fold can hold any out.
    argv = ["train", str(clip.root), "--event", "any_object", "--frames", "15:62", "--steps", "60"]
    assert main([*argv, "--base-model", str(base_model), "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    spec, _ = load_bundle(tmp_path / "b")
    assert spec.validation is None
    # Its own training frames would take almost any threshold; the model's own boundary is what ships.
    assert spec.smoothing.threshold == FINAL_THRESHOLD
    assert "k-of-n chosen on the training frames; the threshold is the model's own" in out
    assert "warning: no cross-validation: the training frames are too few to hold an occurrence" in out
    assert "warning: only 3 frames are without the event: label at least 20" in out
    assert spec.warnings[0].startswith("no cross-validation") and len(spec.warnings) == 2  # what the cloud shows


def test_the_default_filter_keeps_the_draw_with_the_best_held_out_estimate(
    clip: LabelledDataset, clip_taps: dict[str, np.ndarray], base_model: Path
) -> None:
    candidates = []
    for tap in ("late", "mid"):  # both candidates' folds queue in one pool
        config = TrainConfig(
            event="any_object", architecture="full_frame", tap=tap, input_size=CLIP_SIZE, frames=(0, 240), steps=60
        )
        config = dataclasses.replace(config, ensemble=ENSEMBLE, seed=7)
        candidates.append((load_training_data(clip, config, base_model, progress=False), config))
    for (data, config), (kept, validation) in zip(candidates, best_draws(candidates), strict=True):
        estimates = {}
        for draw in range(DRAWS):  # each draw cross-validated on its own, as best_draws must have done
            seeded = dataclasses.replace(config, seed=7 + DRAW_SEED_STEP * draw)
            fit = partial(fit_mc, seeded, progress=False)
            estimates[seeded.seed] = cross_validate(data, seeded, fit, threshold=FINAL_THRESHOLD)
        best_seed = max(estimates, key=lambda seed: estimates[seed].validation.event_f1)  # the first on a tie
        assert kept == dataclasses.replace(config, seed=best_seed)
        assert validation is not None and validation.validation == estimates[best_seed].validation
        np.testing.assert_array_equal(validation.scores, estimates[best_seed].scores)
        assert validation.point == estimates[best_seed].point  # the kept draw's k-of-n goes into the filter ...
        assert validation.point.threshold == FINAL_THRESHOLD  # ... at the final model's own threshold


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_fits_side_by_side_count_the_cores_this_process_may_use() -> None:
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})  # as `taskset -c N` or a container's CPU set
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    assert usable_cores() == len(allowed)


def test_fits_side_by_side_train_what_they_would_one_after_another(clip: LabelledDataset, base_model: Path) -> None:
    config = TrainConfig(event="any_object", architecture="localized", tap="mid", input_size=CLIP_SIZE,
                         frames=(0, 240), steps=40)  # fmt: skip
    data = load_training_data(clip, config, base_model, progress=False)
    model, losses, validation = fit_and_validate(data, config, progress=False)  # the final fit and the folds at once
    alone = cross_validate(data, config, partial(fit_mc, config, progress=False))
    model_alone, losses_alone = fit_mc(config, data, progress=False)
    assert validation is not None and alone is not None
    np.testing.assert_array_equal(validation.scores, alone.scores)
    assert validation.point == alone.point and losses == losses_alone
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, model_alone.state_dict()[name], rtol=0, atol=0)


def test_a_failure_beside_running_fits_stops_them_at_their_next_step(clip: LabelledDataset, base_model: Path) -> None:
    """An error (or Ctrl-C) in the thread waiting on the fits left the pool's end waiting for the running ones:
    minutes of training nobody wanted. A stop requested from outside (a trainer's cancelled job) stops them too."""
    config = TrainConfig(event="any_object", architecture="full_frame", tap="late", input_size=CLIP_SIZE,
                         frames=(0, 240), steps=100_000)  # fmt: skip
    data = load_training_data(clip, config, base_model, progress=False)
    steps_taken: list[int] = []
    fit = partial(fit_mc, config, data, progress=False, on_step=lambda step, _: steps_taken.append(step))
    with pytest.raises(KeyboardInterrupt), fit_pool(1) as pool:
        running = [pool.submit(fit) for _ in range(usable_cores())]
        wait_until(lambda: len(steps_taken) > 5, "the fits to train")
        raise KeyboardInterrupt
    assert all(isinstance(future.exception(), TrainingStopped) for future in running)
    assert len(steps_taken) < config.steps
    assert not stop_requested()  # the next training is not stopped
    with stoppable():
        request_stop("cancelled by an operator")
        with pytest.raises(TrainingStopped, match="cancelled by an operator"):
            fit_mc(config, data, progress=False)
    assert not stop_requested()


def test_ensemble_members_side_by_side_train_what_they_would_one_after_another(
    clip: LabelledDataset, base_model: Path
) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", tap="late", input_size=CLIP_SIZE,
                         frames=(0, 240), steps=61, ensemble=ENSEMBLE)  # fmt: skip
    data = load_training_data(clip, config, base_model, progress=False)
    with ThreadPoolExecutor(2) as pool:
        model, losses = fit_mc(config, data, progress=False, pool=pool)
    model_alone, losses_alone = fit_mc(config, data, progress=False)
    assert losses == losses_alone  # member after member, as without the pool
    assert len(losses) == 61  # the steps asked for, shared out (60 before: 20 a member)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, model_alone.state_dict()[name], rtol=0, atol=0)


def test_the_motion_veto_is_fitted_on_the_training_frames_and_the_estimate_measured_with_it(
    clip: LabelledDataset, clip_taps: dict[str, np.ndarray], base_model: Path, tmp_path: Path
) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", tap="late", input_size=CLIP_SIZE,
                         frames=(0, 240), steps=60, motion_veto=True)  # fmt: skip
    data = load_training_data(clip, config, base_model, progress=False)
    assert data.foreground is not None and data.foreground.shape == (240,)
    validation = cross_validate(data, config, partial(fit_mc, config, progress=False), threshold=FINAL_THRESHOLD)
    model, losses = fit_mc(config, data, progress=False)
    result = finish_training(model, data, config, tmp_path / "b", base_model, losses, validation, FINAL_THRESHOLD)
    assert result.spec.motion is not None  # the synthetic objects always move
    vetoed = result.validation
    assert vetoed is not None and vetoed.point == validation.point  # the same operating point ...
    held_out = np.concatenate([fold.held_out for fold in validation.plan.folds])
    before, after = validation.scores[held_out], vetoed.scores[held_out]
    changed = before != after
    assert changed.any() and np.all(after[changed] == 0.0)  # ... with the frames the veto holds back at 0
    assert not (data.labels[held_out[changed]] == 1).all()  # (frames without an object, which do not move)
    assert result.spec.validation.event_f1 == vetoed.validation.event_f1  # the estimate the filter ships with
    # The same frames as a dataset of every other camera frame (footage requested at half the camera's rate): no
    # frame follows the one before it, so no background model watches long enough to say how the region moves on
    # the camera, and the filter gets no veto.
    sampled = dataclasses.replace(clip, camera_frames=2 * np.arange(clip.n_frames))
    sampled_data = load_training_data(sampled, config, base_model, progress=False)
    assert sampled_data.foreground is not None and np.isnan(sampled_data.foreground).all()
    unvetoed = finish_training(
        model, sampled_data, config, tmp_path / "s", base_model, losses, validation, FINAL_THRESHOLD
    )
    assert unvetoed.spec.motion is None
    assert unvetoed.no_veto is not None and "consecutive camera frames" in unvetoed.no_veto
    assert result.no_veto is None


def test_data_that_cannot_be_cross_validated_is_tried_once(
    tiny: LabelledDataset, base_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 12), steps=4)
    data = load_training_data(tiny, config, base_model, progress=False)
    late = dataclasses.replace(config, tap="late")
    with caplog.at_level(logging.WARNING, logger="models.training"):
        assert best_draws([(data, config), (data, late)]) == [(config, None), (late, None)]
    assert caplog.text.count("cannot cross-validate any_object") == 1  # once for both candidates, as for one draw


def test_an_event_seen_at_one_place_of_its_region_is_warned_about() -> None:
    # A full-frame MC whose cell logit is channel 0 of the cell: its winner is the brightest cell.
    region = np.ones((8, 8), bool)
    model = build_mc("full_frame", 4, (8, 8), mask=region)
    with torch.no_grad():
        for conv in model.cells:
            if isinstance(conv, torch.nn.Conv2d):
                conv.weight.zero_()
                conv.bias.zero_()
                conv.weight[0, 0] = 1.0
    roi = ROI(x0=0.5, y0=0.0, x1=1.0, y1=1.0)
    at_one_place = torch.zeros(12, 4, 8, 8)
    at_one_place[:, 0, 6, 1] = 1.0  # every positive frame: the event at row 6, column 1
    tap = (8, 16)  # the region is the tap's right half: columns 8-15
    warning = one_place_warning(model, at_one_place, roi, region, tap)
    assert warning is not None and "around x=0.59, y=0.81 of the frame" in warning
    moving = torch.zeros(12, 4, 8, 8)
    moving[np.arange(12), 0, np.arange(12) % 8, (3 * np.arange(12)) % 8] = 1.0  # across the region
    assert one_place_warning(model, moving, roi, region, tap) is None
    narrow = np.zeros((8, 8), bool)
    narrow[:, :2] = True  # a region two cells wide has no separate places to tell apart
    assert one_place_warning(model, at_one_place, roi, narrow, tap) is None
    # With a cell of context the crop starts a column left of the region: the place is told in frame coordinates.
    quarter = ROI(x0=0.5, y0=0.0, x1=0.75, y1=1.0, context=1)  # columns 8-11, the crop 7-12
    crop = torch.zeros(12, 4, 8, 6)
    crop[:, 0, 6, 2] = 1.0  # column 9 of the tap
    warning = one_place_warning(model, crop, quarter, quarter.cell_mask(*tap), tap)
    assert warning is not None and "around x=0.59, y=0.81 of the frame" in warning


def test_a_step_hook_sees_every_step_of_the_model_being_trained(tiny: LabelledDataset, base_model: Path) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 48), steps=6)
    data = load_training_data(tiny, config, base_model, progress=False)
    seen: list[tuple[int, bool, torch.Tensor]] = []

    def hook(step: int, model: torch.nn.Module) -> None:
        model.eval()  # a learning curve scores the model mid-training; training must go on in train mode
        seen.append((step, model.training, next(model.parameters()).detach().clone()))

    model, losses = fit_mc(config, data, progress=False, on_step=hook)
    assert [step for step, _, _ in seen] == [1, 2, 3, 4, 5, 6] and len(losses) == 6
    assert not any(torch.equal(a, b) for (_, _, a), (_, _, b) in itertools.pairwise(seen))  # each after a step
    assert torch.equal(seen[-1][2], next(model.parameters()))
    assert model.training  # put back after the hook


def test_an_ensemble_spreads_the_steps_over_members_of_different_seeds(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path
) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 48), steps=9,
                         ensemble=3)  # fmt: skip
    data = load_training_data(tiny, config, base_model, progress=False)
    model, losses = fit_mc(config, data, progress=False)
    assert isinstance(model, Ensemble) and len(model.members) == 3 and len(losses) == 9  # 3 steps each
    first = [next(member.parameters()) for member in model.members]
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    result = train_mc(tiny, config, tmp_path / "bundle", base_model, progress=False)
    spec, onnx_bytes = load_bundle(result.bundle)
    check_mc_model(spec, onnx_bytes, EFFICIENTNET_LITE0_TAPS["late"].shape(TINY_SIZE))
    windowed = dataclasses.replace(config, architecture="windowed")
    with pytest.raises(FilterForwardError, match="an ensemble has 1 to 8 members of a single-frame kind"):
        load_training_data(tiny, windowed, base_model, progress=False)


TRIANGLE = ROI(polygon=((0.3, 0.0), (1.0, 0.0), (1.0, 1.0)))


def test_scaled_training_views_are_the_base_dnn_at_other_input_sizes(tiny: LabelledDataset, base_model: Path) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 48),
                         roi=TRIANGLE, scales=(0.5, 1.5))  # fmt: skip
    data = load_training_data(tiny, config, base_model, progress=False)
    assert [view.input_size for view in data.views] == [(64, 64), (192, 128)]  # rounded to multiples of 32
    frames = np.array([3, 7, 40])
    for number, view in enumerate(data.views, start=1):
        request = FeatureRequest("late", TRIANGLE)
        cached = cached_features(tiny, [request], view.input_size, None, base_model, progress=False)[request]
        tap = EFFICIENTNET_LITE0_TAPS["late"].shape(view.input_size)
        np.testing.assert_array_equal(view.mask, TRIANGLE.cell_mask(*tap[1:]))
        features, valid = data.inputs(frames, view=number)
        np.testing.assert_array_equal(features.numpy(), cached[frames].astype(np.float32))
        assert valid.shape == (3, *view.mask.shape) and (valid.numpy() == view.mask).all()
        # An MC trained at the edge's size takes a view's region cells in place of its own mask.
        own = build_mc("full_frame", 320, data.crop_chw[1:], 1, data.mask).eval()
        at_view = build_mc("full_frame", 320, view.mask.shape, 1, view.mask).eval()
        at_view.load_state_dict({k: v for k, v in own.state_dict().items() if k != "mask"}, strict=False)
        with torch.no_grad():
            torch.testing.assert_close(own.logits(features, valid), at_view.logits(features))
    assert data.only(data.frames[:10]).views == data.views  # a cross-validation fold trains on the views too


def test_mirrored_training_view_is_the_base_dnn_on_mirror_images(tiny: LabelledDataset, base_model: Path) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 48),
                         roi=TRIANGLE, mirror=True)  # fmt: skip
    data = load_training_data(tiny, config, base_model, progress=False)
    (view,) = data.views
    assert view.input_size == TINY_SIZE
    np.testing.assert_array_equal(view.mask, data.mask)  # every cell mirrored back to where it lies in the frame
    base = BaseDNN(TINY_SIZE, base_model)
    frame = dict(tiny.frames(5, 6))[5]
    late = base.run(base.prepare(frame)[:, ::-1], ["late"])["late"][0, :, :, ::-1]
    rows, cols = TRIANGLE.cells(*late.shape[1:])
    mirrored, valid = data.inputs(np.array([5]), view=1)
    np.testing.assert_allclose(mirrored.numpy()[0], late[:, rows, cols], atol=0.02, rtol=0.01)
    assert (valid.numpy()[0] == data.mask).all()
    plain, _ = data.inputs(np.array([5]))
    assert np.abs(plain.numpy() - mirrored.numpy()).max() > 0.1  # another base-DNN pass, not the same crop
    with pytest.raises(FilterForwardError, match="mirrored training frames need a full_frame MC, not localized"):
        load_training_data(tiny, dataclasses.replace(config, architecture="localized", tap="mid"), base_model)


def test_scaled_training_trains_on_every_view_and_exports_the_edge_size(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path
) -> None:
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 48),
                         roi=TRIANGLE, scales=(0.5, 1.5), steps=30)  # fmt: skip
    data = load_training_data(tiny, config, base_model, progress=False)
    shapes: list[tuple[int, ...]] = []
    model = new_model(config, data)
    model.cells.register_forward_pre_hook(lambda _module, inputs: shapes.append(tuple(inputs[0].shape[2:])))
    optimizer = make_optimizer("adam", model.parameters(), 1e-3, 30)
    sampler = BalancedSampler(data.frames, data.targets, 8, 0)
    train_steps(Logits(model), data, optimizer, sampler, config, progress=False)
    sizes = {data.crop_chw[1:], *(view.mask.shape for view in data.views)}
    ranked = set(shapes) - {(2, 1)}  # every cell ranked without autograd, then each winner and rival run with it
    assert ranked == sizes and len(sizes) == 3  # every view trained on, the edge's size included
    result = train_mc(tiny, config, tmp_path / "bundle", base_model, progress=False)
    spec, onnx_bytes = load_bundle(result.bundle)
    assert spec.input_size == TINY_SIZE
    check_mc_model(spec, onnx_bytes, EFFICIENTNET_LITE0_TAPS["late"].shape(TINY_SIZE))
    for bad, message in [
        ({"architecture": "localized", "tap": "mid"}, r"training scales .* need a full_frame MC, not localized"),
        ({"scales": (8.0,)}, "training scales 8.0 are not all factors from 0.25 to 4"),
    ]:
        with pytest.raises(FilterForwardError, match=message):
            load_training_data(tiny, dataclasses.replace(config, **bad), base_model, progress=False)


DIVERGING = {"architecture": "localized", "optimizer": "onebit_adam", "lr": 1.0, "steps": 60}


def test_a_diverged_mc_with_finite_parameters_writes_no_bundle(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """1-bit Adam at the largest lr throws a localized MC's weights to about 1e21: still finite, but its logits
    overflow, so its loss and scores are NaN (and the optimizer skips every step after). The divergence is what is
    reported, not the bundle check's "score is nan; it must be a probability"."""
    config = TrainConfig(event="any_object", input_size=TINY_SIZE, frames=(0, 40), **DIVERGING)
    data = load_training_data(tiny, config, base_model, progress=False)
    model, losses = fit_mc(config, data, progress=False)
    assert np.isnan(losses[-1]) and all(bool(torch.isfinite(p).all()) for p in model.parameters())
    expected = r"^training diverged: the final training loss is nan after 60 steps with onebit_adam at lr 1, so no "
    with pytest.raises(FilterForwardError, match=expected + r"bundle was written: lower --lr, try another --optimizer"):
        finish_training(model, data, config, tmp_path / "b", base_model, losses, None)
    # An ensemble's losses end with its last member's: NaN scores alone also say that training diverged.
    with pytest.raises(FilterForwardError, match=r"^training diverged: the MC scores 40 of 40 training frames NaN"):
        finish_training(model, data, config, tmp_path / "b", base_model, losses[:1], None)
    assert not (tmp_path / "b").exists()
    argv = ["train", str(tiny.root), "--event", "any_object", "--frames", "0:40", "--base-model", str(base_model)]
    argv += ["--arch", "localized", "--optimizer", "onebit_adam", "--lr", "1", "--steps", "60"]
    assert main([*argv, "--out", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("filterforward train: error: training diverged: the final training loss is nan after 60")
    assert not (tmp_path / "cli").exists()


def test_an_mc_that_learned_nothing_writes_no_bundle(tiny: LabelledDataset, base_model: Path, tmp_path: Path) -> None:
    """Units killed by a step too large (1-bit LAMB given --lr 1e-2 on the car clip ended at loss ln 2 on every seed)
    leave one score for every frame: the bundle fired on every frame of the car clip."""
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=TINY_SIZE, frames=(0, 40), steps=4)
    data = load_training_data(tiny, config, base_model, progress=False)
    model, losses = fit_mc(config, data, progress=False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()  # a dead network: its logit is 0 whatever the frame
    with pytest.raises(FilterForwardError, match=r"^training failed: the MC gives all 40 training frames the same "):
        finish_training(model, data, config, tmp_path / "b", base_model, losses, None)
    assert not (tmp_path / "b").exists()


def test_an_input_size_that_cannot_fit_in_memory_is_refused_up_front(
    tiny: LabelledDataset, base_model: Path, tmp_path: Path
) -> None:
    """8192x8192 passed validation, then the OOM killer ended the run: the base DNN alone needs about 50 GiB there.
    The CLI runs under a 12 GiB address-space limit (`ulimit -v`), which the check counts, so the test does not
    depend on this machine's memory (and a run without the check fails on an allocation, not the OOM killer)."""
    argv = [sys.executable, "-m", "filterforward", "train", str(tiny.root), "--event", "any_object"]
    argv += ["--arch", "localized", "--frames", "0:40", "--input-size", "8192x8192", "--base-model", str(base_model)]
    limit = 12 * GIB
    run = subprocess.run(
        [*argv, "--out", str(tmp_path / "b")],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = run.stderr.strip().splitlines()[-1]
    expected = (
        r"input size 8192x8192 needs about \d+\.\d GiB of memory \(the base DNN and the features of 40 frames\) but "
    )
    assert re.fullmatch(
        rf"filterforward train: error: {expected}\d+\.\d GiB is available: use --input-size (\d+)x\1 or smaller", last
    ), last
    assert run.returncode == 2 and not (tmp_path / "b").exists()
    # The largest size that fits is named; normal sizes pass, here and with a few GiB.
    config = TrainConfig(event="any_object", architecture="full_frame", input_size=(8192, 8192), frames=(0, 48))
    with pytest.raises(FilterForwardError, match=r"but 3\.0 GiB is available: use --input-size 1984x1984 or smaller"):
        check_memory(tiny, [config], available=3 * GIB)
    for size in [(1920, 1088), (768, 448)]:
        check_memory(tiny, [dataclasses.replace(config, input_size=size)], available=3 * GIB)
        check_config(tiny, dataclasses.replace(config, input_size=size))
