"""MC architectures: shapes, ONNX export equivalence, the windowed MC's edge-side state, and their cost."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from models.efficientnet_lite import EfficientNetLite0
from models.errors import FilterForwardError
from models.mc_export import export_mc, verify_export
from models.microclassifiers import ARCHITECTURES, build_mc, count_macs, example_inputs
from models.taps import EFFICIENTNET_LITE0_TAPS, PIXEL_TAP

INPUT_SIZE = (768, 448)
TAP_OF = {"full_frame": "late", "localized": "mid", "windowed": "mid", "discrete": "pixels"}
# A crop per architecture small enough to keep the suite fast; odd sizes exercise padding and pooling.
CROPS = {"full_frame": (320, 5, 7), "localized": (112, 9, 13), "windowed": (112, 7, 11), "discrete": (3, 45, 77)}


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def session(onnx_bytes: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_scores_are_probabilities_per_sample(architecture: str) -> None:
    crop = CROPS[architecture]
    model = build_mc(architecture, crop[0], crop[1:]).eval()
    with torch.no_grad():
        out = model(*example_inputs(model, crop, batch=4))
    score = out[0] if architecture == "windowed" else out
    assert score.shape == (4,)
    assert ((score > 0) & (score < 1)).all()
    if architecture == "windowed":
        assert out[1].shape == (4, model.reduced, *crop[1:])


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_onnx_export_matches_torch_at_any_batch(architecture: str) -> None:
    crop = CROPS[architecture]
    model = build_mc(architecture, crop[0], crop[1:])
    onnx_bytes = export_mc(model, crop)
    assert verify_export(model, onnx_bytes, crop, batch=5) <= 1e-5
    inputs = example_inputs(model, crop, batch=7)
    names = [i.name for i in session(onnx_bytes).get_inputs()]
    got = session(onnx_bytes).run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})
    assert got[0].shape == (7,)


def test_export_check_catches_a_model_that_changed_after_export() -> None:
    crop = CROPS["localized"]
    model = build_mc("localized", crop[0], crop[1:])
    onnx_bytes = export_mc(model, crop)
    with torch.no_grad():
        model.head.fc.fc[-1].bias += 1.0
    with pytest.raises(RuntimeError, match="differs from torch"):
        verify_export(model, onnx_bytes, crop)


def run_stream(onnx_bytes: bytes, frames: np.ndarray, window: int, reduced: int) -> np.ndarray:
    """Score a stream frame by frame the way the edge does: a ring buffer of reductions, zeros at the start."""
    mc = session(onnx_bytes)
    height, width = frames.shape[2:]
    ring = np.zeros((1, (window - 1) * reduced, height, width), np.float32)
    scores = []
    for frame in frames:
        score, this = mc.run(["score", "reduced"], {"features": frame[None], "history": ring})
        ring = np.concatenate([ring[:, reduced:], this], axis=1)  # drop the oldest, append the newest
        scores.append(score[0])
    return np.array(scores)


def test_windowed_edge_steps_equal_training_on_stacked_windows() -> None:
    window, (channels, height, width) = 4, CROPS["windowed"]
    model = build_mc("windowed", channels, (height, width), window=window).eval()
    onnx_bytes = export_mc(model, (channels, height, width))
    stream = np.random.default_rng(1).normal(size=(9, channels, height, width)).astype(np.float32)

    # Training's view: for frame t the frames t-W+1..t, those before frame 0 masked out.
    offsets = np.arange(t := len(stream))[:, None] + np.arange(-window + 1, 1)[None]
    valid = offsets >= 0
    windows = stream[np.clip(offsets, 0, None)] * valid[..., None, None, None]
    with torch.no_grad():
        trained = torch.sigmoid(model.logits(torch.from_numpy(windows), torch.from_numpy(valid))).numpy()

    edge = run_stream(onnx_bytes, stream, window, model.reduced)
    np.testing.assert_allclose(edge, trained, atol=1e-5)
    assert len(edge) == t
    # The mask matters: zero *features* are not zero *reductions* (the 1x1 conv has a bias).
    with torch.no_grad():
        unmasked = torch.sigmoid(model.logits(torch.from_numpy(windows))).numpy()
    assert not np.allclose(unmasked[: window - 1], edge[: window - 1], atol=1e-5)


def test_bad_architecture_or_shape_is_explained() -> None:
    with pytest.raises(FilterForwardError, match="unknown MC architecture 'yolo'"):
        build_mc("yolo", 112, (4, 4))
    with pytest.raises(FilterForwardError, match="at least one channel and cell"):
        build_mc("localized", 112, (0, 4))
    with pytest.raises(FilterForwardError, match="window of at least 2"):
        build_mc("windowed", 112, (4, 4), window=1)


def test_fifty_mcs_cost_under_a_quarter_of_the_base_dnn() -> None:
    width, height = INPUT_SIZE
    base = count_macs(EfficientNetLite0().eval(), (torch.zeros(1, 3, height, width),))
    for architecture in ("full_frame", "localized", "windowed"):
        tap = EFFICIENTNET_LITE0_TAPS[TAP_OF[architecture]]
        crop = tap.shape(INPUT_SIZE)  # full-frame ROI: the most expensive case
        model = build_mc(architecture, crop[0], crop[1:])
        assert 50 * count_macs(model, example_inputs(model, crop)) < 0.25 * base, architecture
    # The discrete baseline is the expensive kind the MCs replace.
    crop = PIXEL_TAP.shape(INPUT_SIZE)
    discrete = build_mc("discrete", crop[0], crop[1:])
    assert count_macs(discrete, example_inputs(discrete, crop)) > 0.05 * base


def test_fc_input_stays_bounded_at_1080p() -> None:
    # The paper's 67x120 mid tap: without pooling the localized FC alone would hold 13 M weights.
    channels, height, width = EFFICIENTNET_LITE0_TAPS["mid"].shape((1920, 1088))
    for architecture in ("localized", "windowed"):
        model = build_mc(architecture, channels, (height, width))
        assert sum(p.numel() for p in model.parameters()) < 600_000, architecture
