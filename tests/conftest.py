"""Shared fixtures: where the real camera clips are, a scratch cache for exported models, headless Chromium."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import pytest

from models.filterspec import FilterSpec
from models.taps import EFFICIENTNET_LITE0_TAPS, PIXEL_TAP, PIXELS

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """The real clips: $FILTERFORWARD_DATA, else ../shared/data beside the checkout."""
    env = os.environ.get("FILTERFORWARD_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    return next((path for path in candidates if path.is_dir()), None)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("real clips not found: set FILTERFORWARD_DATA or put them at ../shared/data")
    return path


@pytest.fixture(scope="session")
def intel_car(shared_data: Path) -> Path:
    return shared_clip(shared_data, "intel-car-detection")


@pytest.fixture(scope="session")
def adl_walkway(shared_data: Path) -> Path:
    """ADL-Rundle-6 (MOT15): a 1080p walkway, people near and far from the camera."""
    return shared_clip(shared_data, "adl-rundle-6")


def shared_clip(shared_data: Path, name: str) -> Path:
    """A clip folder of the shared data; its tests skip where it is missing."""
    path = shared_data / name
    if not path.is_dir():
        pytest.skip(f"{path} is missing")
    return path


def export_filter(
    architecture: str,
    tap: str,
    input_size: tuple[int, int],
    name: str = "test-filter",
    bias: float | None = None,
    **spec_fields: object,
) -> tuple[FilterSpec, bytes]:
    """A real exported MC with random weights (or a forced output bias: +10 always fires, -10 never)."""
    import torch

    from models.mc_export import export_constant_mc, export_mc
    from models.microclassifiers import build_mc

    spec = FilterSpec(name=name, architecture=architecture, tap=tap, input_size=input_size, **spec_fields)
    tap_info = PIXEL_TAP if tap == PIXELS else EFFICIENTNET_LITE0_TAPS[tap]
    channels, height, width = tap_info.shape(input_size)
    crop = (channels, *spec.roi.cell_shape(height, width))
    torch.manual_seed(zlib.crc32(name.encode()))
    model = build_mc(architecture, crop[0], crop[1:], spec.window)
    return spec, export_mc(model, crop) if bias is None else export_constant_mc(model, crop, bias)


@pytest.fixture(scope="session")
def short_clip(tmp_path_factory: pytest.TempPathFactory, intel_car: Path) -> Path:
    """The first 40 frames of the real car clip, as its own video file (keeps edge runs short)."""
    import av

    from models.datasets import open_dataset

    out = tmp_path_factory.mktemp("clip") / "cars-40.mp4"
    dataset = open_dataset(intel_car)
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 384, 216, "yuv420p"
        for _, image in dataset.frames(180, 220):
            small = cv2.resize(image, (384, 216), interpolation=cv2.INTER_AREA)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(small, format="bgr24")))
        container.mux(stream.encode(None))
    return out


@pytest.fixture(scope="session")
def make_filter() -> Callable[..., tuple[FilterSpec, bytes]]:
    """export_filter as a fixture, so test modules need not import conftest."""
    return export_filter


@pytest.fixture(scope="module")
def base_model() -> Path:
    """The exported base DNN from the usual cache (exported once, shared by every test)."""
    from models.base_export import ensure_base_model

    return ensure_base_model()


@pytest.fixture(scope="module")
def feature_cache(base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh cache for one test module, so its feature-cache hits and misses are its own; spawned workers
    and torchrun inherit it through the environment."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("cache")
        patch.setenv("FILTERFORWARD_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def red_bundle(intel_car: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The red-vehicle MC at the end-to-end tests' input size, trained once per session by `filterforward train` on
    frames 0:212 (the split of tests/test_replay_eval.py; the red car passes at frames 187-238)."""
    from edge_site import INPUT_SIZE, TRAIN_FRAMES, filterforward

    out = tmp_path_factory.mktemp("red")
    size = "x".join(map(str, INPUT_SIZE))
    result = filterforward(
        "train", str(intel_car), "--event", "red_vehicle_present", "--arch", "full_frame",
        "--input-size", size, "--frames", TRAIN_FRAMES, "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's Chromium (/usr/bin/chromium), headless, driven by Playwright, which must not download a browser;
    the web-page tests skip themselves where it is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()
