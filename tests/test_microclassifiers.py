"""MC architectures: shapes, ONNX export equivalence, the windowed MC's edge-side state, and their cost."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.efficientnet_lite import EfficientNetLite0
from models.errors import FilterForwardError
from models.mc_export import export_mc, verify_export
from models.mc_kinds import MC_KINDS, auto_context
from models.microclassifiers import Ensemble, build_mc, count_macs
from models.taps import EFFICIENTNET_LITE0_TAPS, PIXEL_TAP

INPUT_SIZE = (768, 448)
# A crop per architecture small enough to keep the suite fast; odd sizes exercise padding and pooling.
CROPS = {"full_frame": (320, 5, 7), "localized": (112, 9, 13), "windowed": (112, 7, 11), "discrete": (3, 45, 77)}


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def session(onnx_bytes: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("architecture", list(MC_KINDS))
def test_scores_are_probabilities_per_sample(architecture: str) -> None:
    crop = CROPS[architecture]
    model = build_mc(architecture, crop[0], crop[1:]).eval()
    with torch.no_grad():
        out = model(*model.example_inputs(crop, batch=4))
    windowed = MC_KINDS[architecture].windowed
    score = out[0] if windowed else out
    assert score.shape == (4,)
    assert ((score > 0) & (score < 1)).all()
    if windowed:
        assert out[1].shape == (4, model.reduced, *crop[1:])


@pytest.mark.parametrize("architecture", list(MC_KINDS))
def test_onnx_export_matches_torch_at_any_batch(architecture: str) -> None:
    crop = CROPS[architecture]
    model = build_mc(architecture, crop[0], crop[1:])
    onnx_bytes = export_mc(model, crop)
    assert verify_export(model, onnx_bytes, crop, batch=5) <= 1e-5
    inputs = model.example_inputs(crop, batch=7)
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
        tap = EFFICIENTNET_LITE0_TAPS[MC_KINDS[architecture].default_tap]
        crop = tap.shape(INPUT_SIZE)  # full-frame ROI: the most expensive case
        model = build_mc(architecture, crop[0], crop[1:])
        assert 50 * count_macs(model, model.example_inputs(crop)) < 0.25 * base, architecture
    # The discrete baseline is the expensive kind the MCs replace.
    crop = PIXEL_TAP.shape(INPUT_SIZE)
    discrete = build_mc("discrete", crop[0], crop[1:])
    assert count_macs(discrete, discrete.example_inputs(crop)) > 0.05 * base


def test_fc_input_stays_bounded_at_1080p() -> None:
    # The paper's 67x120 mid tap: without pooling the localized FC alone would hold 13 M weights.
    channels, height, width = EFFICIENTNET_LITE0_TAPS["mid"].shape((1920, 1088))
    for architecture in ("localized", "windowed"):
        model = build_mc(architecture, channels, (height, width))
        assert sum(p.numel() for p in model.parameters()) < 600_000, architecture


# --- region masks ----------------------------------------------------------------------------------


def _triangle_mask(height: int, width: int) -> np.ndarray:
    """The cells of a crop inside a triangle (what ROI.cell_mask gives for a polygon)."""
    from models.roi import ROI

    return ROI(polygon=((0.0, 0.0), (1.0, 1.0), (0.0, 1.0))).cell_mask(height, width)


@pytest.mark.parametrize("architecture", list(MC_KINDS))
def test_masked_mcs_ignore_cells_outside_the_region_also_in_onnx(architecture: str) -> None:
    crop = CROPS[architecture]
    mask = _triangle_mask(*crop[1:])
    assert 0 < mask.sum() < mask.size
    model = build_mc(architecture, crop[0], crop[1:], mask=mask).eval()
    inputs = model.example_inputs(crop, batch=3)
    ignored = ~torch.from_numpy(mask)
    if architecture == "full_frame":  # a region cell's neighbours are its rivals (peak logits): the rest is ignored
        ignored = F.max_pool2d((~ignored)[None].float(), 3, 1, 1)[0] == 0
    assert ignored.any()
    changed = inputs[0].clone()
    changed[:, :, ignored] = 50 * torch.randn(3, crop[0], int(ignored.sum()))
    with torch.no_grad():
        before = model(*inputs)
        after = model(changed, *inputs[1:])
    before, after = (out[0] if isinstance(out, tuple) else out for out in (before, after))
    assert torch.allclose(before, after)
    assert verify_export(model, export_mc(model, crop), crop, batch=4) <= 1e-5


@pytest.mark.parametrize("context", [0, 2])
def test_full_frame_training_path_equals_the_max_with_its_gradient(context: int) -> None:
    """Training ranks the cells without autograd and back-propagates only through each sample's best cell:
    the same logits and the same gradients as the plain max over the (masked) cells, whatever the neighbourhood."""
    crop = CROPS["full_frame"]
    features = torch.randn(6, *crop)
    model = build_mc("full_frame", crop[0], crop[1:], mask=_triangle_mask(*crop[1:]), context=context)
    fast = model.train().logits(features)
    fast.sum().backward()
    fast_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    plain = model.cell_logits(features).amax(dim=1)
    plain.sum().backward()
    assert torch.allclose(fast, plain, atol=1e-6)
    for a, b in zip(fast_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def _blob_detector(context: int = 0) -> nn.Module:
    """A one-channel full-frame MC whose logit at a cell is that cell's feature value (for non-negative features)."""
    model = build_mc("full_frame", 1, (3, 6), mask=np.tile(np.arange(6) < 3, (3, 1)), context=context)  # left half
    with torch.no_grad():
        for conv in (m for m in model.cells if isinstance(m, nn.Conv2d)):
            conv.weight.zero_()
            conv.bias.zero_()
            conv.weight[0, 0] = 1.0
    return model.eval()


def test_an_object_counts_for_the_region_where_its_response_peaks() -> None:
    """An object just beside the region (its response spilling over the region's edge cell) scores low; the same
    object just inside scores its full response; without a mask the score is the plain max."""
    model = _blob_detector()
    beside, inside = torch.zeros(2, 1, 3, 6), torch.zeros(2, 1, 3, 6)
    beside[:, 0, 1, 2:5] = torch.tensor([4.0, 9.0, 4.0])  # peak at column 3, outside the region
    inside[:, 0, 1, 1:4] = torch.tensor([4.0, 9.0, 4.0])  # peak at column 2, its last column
    with torch.no_grad():
        assert model.logits(beside)[0] == 0.0  # the empty background's: the edge cell's is 2 * 4 - 9
        assert model.logits(inside)[0] == 9.0
        model.set_mask(None)
        assert model.logits(beside)[0] == 9.0


def test_with_more_context_an_object_two_cells_beside_the_region_does_not_count() -> None:
    """An object whose response peaks two cells outside the region, with a lesser maximum on the region's edge cell
    (a body reaching into the region): a cell compared with its direct neighbours only counts that lesser maximum;
    compared with the neighbours as far as the context reaches (two cells), it counts by how far the object's peak
    beats it. The same object inside the region counts fully, and the exported graph scores the same."""
    response = torch.zeros(1, 1, 3, 6)
    response[0, 0, 1, 2:6] = torch.tensor([5.0, 4.0, 9.0, 8.0])  # the object's peak at column 4, two cells outside
    with torch.no_grad():
        assert _blob_detector(context=1).logits(response)[0] == 5.0  # the edge cell is a local maximum
        wide = _blob_detector(context=2)
        assert wide.logits(response)[0] == 2 * 5.0 - 9.0
        inside = torch.roll(response, -2, dims=3)  # peak at column 2, the region's last column
        assert wide.logits(inside)[0] == 9.0
    assert verify_export(wide, export_mc(wide, (1, 3, 6)), (1, 3, 6), batch=2) <= 1e-5


@pytest.mark.parametrize(
    ("input_size", "cells"),
    [((320, 256), 1), ((384, 224), 1), ((640, 480), 2), ((768, 448), 2), ((1152, 672), 3), ((1920, 1088), 4)],
)
def test_the_default_filter_s_context_grows_with_the_input_size(input_size: tuple[int, int], cells: int) -> None:
    """Objects span more cells at larger input sizes; at most models.roi.MAX_CONTEXT (4)."""
    assert auto_context(input_size) == cells


def test_a_mask_must_fit_the_crop() -> None:
    with pytest.raises(FilterForwardError, match="region mask must be 4x5"):
        build_mc("full_frame", 8, (4, 5), mask=np.ones((5, 4), bool))
    with pytest.raises(FilterForwardError, match="with a cell inside"):
        build_mc("full_frame", 8, (4, 5), mask=np.zeros((4, 5), bool))


@pytest.mark.parametrize(("count", "masked", "context"), [(3, False, 0), (4, False, 0), (3, True, 0), (3, True, 2)])
def test_an_ensemble_takes_its_members_median_logit_and_exports_as_one_graph(
    count: int, masked: bool, context: int
) -> None:
    mask = np.tri(4, 6, 1, dtype=bool) if masked else None
    members = []
    for seed in range(1, count + 1):
        torch.manual_seed(seed)
        members.append(build_mc("full_frame", 8, (4, 6), mask=mask, context=context))
    ensemble = Ensemble(members).eval()
    features = torch.randn(5, 8, 4, 6)
    with torch.no_grad():
        expected = torch.from_numpy(np.median(np.stack([m.logits(features).numpy() for m in members]), axis=0))
        assert torch.allclose(ensemble.logits(features), expected)
        assert torch.allclose(ensemble(features), torch.sigmoid(expected))
        cells = np.median(np.stack([m.cell_logits(features).numpy() for m in members]), axis=0)
        assert torch.allclose(ensemble.cell_logits(features), torch.from_numpy(cells))
    assert ensemble.architecture == "full_frame"
    onnx_bytes = export_mc(ensemble, (8, 4, 6))
    (score,) = ort.InferenceSession(onnx_bytes).run(["score"], {"features": features.numpy()})
    np.testing.assert_allclose(score, torch.sigmoid(expected).numpy(), atol=1e-5)
    # The members run stacked: three convs for the whole ensemble, not three per member.
    assert [node.op_type for node in onnx.load_from_string(onnx_bytes).graph.node].count("Conv") == 3
    windowed = build_mc("windowed", 8, (4, 6), window=3)
    with pytest.raises(FilterForwardError, match="members of one single-frame kind"):
        Ensemble([windowed, windowed])


def test_an_ensemble_is_built_without_drawing_from_the_global_generator() -> None:
    # Parallel draws initialise each fold's model from its seed on torch's global generator while another thread
    # puts its trained members together: that must not draw from it, or the first model's start would depend on
    # timing (models/model_selection.py best_draws).
    members = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        members.append(build_mc("full_frame", 8, (4, 6)))
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    assert Ensemble(members).stacked is not None
    assert torch.equal(torch.rand(4), expected)
