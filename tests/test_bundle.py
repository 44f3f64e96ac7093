"""Filter bundles: write/load round trip, and every kind of bad bundle refused with a clear message."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from models import mc_limits
from models.bundle import MAX_MODEL_BYTES, MODEL_FILE, SPEC_FILE, check_mc_model, crop_shape, load_bundle, write_bundle
from models.errors import FilterForwardError
from models.filterspec import FilterSpec
from models.mc_export import export_mc, to_onnx
from models.mc_limits import run_with_deadline
from models.microclassifiers import build_mc
from models.roi import ROI
from models.taps import EFFICIENTNET_LITE0_TAPS

INPUT_SIZE = (320, 192)
ROI_RIGHT = ROI(x0=0.5, y0=0.25, x1=1.0, y1=1.0)


def spec_for(architecture: str, tap: str, **changes: object) -> FilterSpec:
    return FilterSpec(name="cars", architecture=architecture, tap=tap, roi=ROI_RIGHT, input_size=INPUT_SIZE, **changes)


def tap_shape(tap: str, input_size: tuple[int, int] = INPUT_SIZE) -> tuple[int, int, int]:
    return EFFICIENTNET_LITE0_TAPS[tap].shape(input_size)


def trained_like(spec: FilterSpec) -> bytes:
    """An (untrained) MC exported for the spec's tap and ROI: what training writes into a bundle."""
    crop = crop_shape(spec, tap_shape(spec.tap))
    return export_mc(build_mc(spec.architecture, crop[0], crop[1:], spec.window), crop)


def export_module(module: nn.Module, crop: tuple[int, int, int], outputs: list[str]) -> bytes:
    return to_onnx(module, (torch.zeros(1, *crop),), ["features"], outputs)


@pytest.fixture(scope="module")
def localized() -> tuple[FilterSpec, bytes]:
    spec = spec_for("localized", "mid")
    return spec, trained_like(spec)


@pytest.mark.parametrize(("architecture", "tap"), [("full_frame", "late"), ("localized", "mid"), ("windowed", "mid")])
def test_bundle_round_trip_and_check(tmp_path: Path, architecture: str, tap: str) -> None:
    spec = spec_for(architecture, tap, window=3)
    onnx_bytes = trained_like(spec)
    write_bundle(tmp_path / "b", spec, onnx_bytes)
    loaded_spec, loaded_bytes = load_bundle(tmp_path / "b")
    assert loaded_spec == spec
    assert loaded_bytes == onnx_bytes
    check_mc_model(loaded_spec, loaded_bytes, tap_shape(tap))


def test_corrupt_onnx_is_refused(localized: tuple[FilterSpec, bytes]) -> None:
    spec, onnx_bytes = localized
    with pytest.raises(FilterForwardError, match="not a valid ONNX file"):
        check_mc_model(spec, b"\x08\x07garbage" * 50, tap_shape("mid"))
    with pytest.raises(FilterForwardError, match="not a valid ONNX file"):
        check_mc_model(spec, onnx_bytes[: len(onnx_bytes) // 2], tap_shape("mid"))


def test_model_for_another_tap_roi_or_size_is_refused(localized: tuple[FilterSpec, bytes]) -> None:
    spec, onnx_bytes = localized
    with pytest.raises(FilterForwardError, match=r"needs \[batch, 112, 11, 10\]; retrain"):
        check_mc_model(spec, onnx_bytes, tap_shape("mid", (320, 224)))
    full = spec.model_copy(update={"roi": ROI()})
    with pytest.raises(FilterForwardError, match=r"has shape \[batch, 112, 9, 10\], but tap 'mid'"):
        check_mc_model(full, onnx_bytes, tap_shape("mid"))
    with pytest.raises(FilterForwardError, match="needs \\[batch, 320"):
        check_mc_model(spec.model_copy(update={"tap": "late"}), onnx_bytes, tap_shape("late"))


class TwoOutputs(nn.Module):
    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sigmoid(features.mean(dim=(1, 2, 3))), features.amax(dim=(1, 2, 3))


class Unbounded(nn.Module):
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features.mean(dim=(1, 2, 3)) + 5.0


class Column(nn.Module):
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(features.mean(dim=(2, 3))[:, :1])


def test_models_breaking_the_output_contract_are_refused(localized: tuple[FilterSpec, bytes]) -> None:
    spec = localized[0]
    crop = crop_shape(spec, tap_shape("mid"))
    with pytest.raises(FilterForwardError, match=r"outputs \['score', 'extra'\], expected exactly \['score'\]"):
        check_mc_model(spec, export_module(TwoOutputs(), crop, ["score", "extra"]), tap_shape("mid"))
    with pytest.raises(FilterForwardError, match="must be a probability"):
        check_mc_model(spec, export_module(Unbounded(), crop, ["score"]), tap_shape("mid"))
    with pytest.raises(FilterForwardError, match=r"shape \[1, 1\] for one frame; it must be \[batch\]"):
        check_mc_model(spec, export_module(Column(), crop, ["score"]), tap_shape("mid"))


def test_windowed_mc_must_match_the_spec_window() -> None:
    spec = spec_for("windowed", "mid", window=5)
    onnx_bytes = trained_like(spec)
    history = r"MC input 'history' has shape \[batch, 64, 9, 10\].*needs \[batch, 32, 9, 10\]"
    with pytest.raises(FilterForwardError, match=history):
        check_mc_model(spec.model_copy(update={"window": 3}), onnx_bytes, tap_shape("mid"))
    # A windowed model under a non-windowed spec: the inputs give it away.
    with pytest.raises(FilterForwardError, match=r"inputs \['features', 'history'\], expected exactly \['features'\]"):
        check_mc_model(spec.model_copy(update={"architecture": "localized"}), onnx_bytes, tap_shape("mid"))


def test_opset_outside_the_supported_range_is_refused(localized: tuple[FilterSpec, bytes]) -> None:
    spec = spec_for("full_frame", "late")
    model = onnx.load_model_from_string(trained_like(spec))
    model.opset_import[0].version = 12  # the full-frame graph (Conv, Relu, ReduceMax, Sigmoid) is valid at 12
    with pytest.raises(FilterForwardError, match="opset 12; export it with an opset from 13 to 21"):
        check_mc_model(spec, model.SerializeToString(), tap_shape("late"))


def test_oversized_model_is_refused(tmp_path: Path, localized: tuple[FilterSpec, bytes]) -> None:
    spec, onnx_bytes = localized
    with pytest.raises(FilterForwardError, match="over the 16 MiB limit"):
        check_mc_model(spec, onnx_bytes + bytes(MAX_MODEL_BYTES), tap_shape("mid"))
    write_bundle(tmp_path, spec, onnx_bytes)
    os.truncate(tmp_path / MODEL_FILE, MAX_MODEL_BYTES + 1)  # sparse: nothing big is written
    with pytest.raises(FilterForwardError, match="over the 16 MiB limit"):
        load_bundle(tmp_path)


def test_bad_spec_json_is_refused(tmp_path: Path, localized: tuple[FilterSpec, bytes]) -> None:
    spec, onnx_bytes = localized
    write_bundle(tmp_path, spec, onnx_bytes)
    data = json.loads((tmp_path / SPEC_FILE).read_text())
    (tmp_path / SPEC_FILE).write_text(json.dumps({**data, "colour": "red"}))
    with pytest.raises(FilterForwardError, match=r"spec\.json is not a valid filter spec: colour: Extra inputs"):
        load_bundle(tmp_path)
    (tmp_path / SPEC_FILE).write_text(json.dumps({**data, "architecture": "yolo"}))
    with pytest.raises(FilterForwardError, match="architecture: Input should be"):
        load_bundle(tmp_path)
    estimate = {"event_f1": 0.9, "f1_min": 0.8, "f1_max": 1.0, "precision": 0.9, "event_recall": 1.0, "folds": 3,
                "occurrences": 3, "method": "occurrences"}  # fmt: skip
    (tmp_path / SPEC_FILE).write_text(json.dumps({**data, "validation": estimate, "warnings": ["few frames"]}))
    with pytest.raises(FilterForwardError, match=r"warnings go in validation\.warnings"):
        load_bundle(tmp_path)
    (tmp_path / SPEC_FILE).write_text(json.dumps({**data, "motion": {"min_foreground": 0, "frames": 5}}))
    with pytest.raises(FilterForwardError, match=r"motion\.min_foreground: Input should be greater than 0"):
        load_bundle(tmp_path)
    (tmp_path / SPEC_FILE).write_text("{not json")
    with pytest.raises(FilterForwardError, match="not valid JSON"):
        load_bundle(tmp_path)


def test_missing_parts_are_explained(tmp_path: Path, localized: tuple[FilterSpec, bytes]) -> None:
    with pytest.raises(FilterForwardError, match="is not a folder"):
        load_bundle(tmp_path / "nope")
    with pytest.raises(FilterForwardError, match=r"spec\.json is missing"):
        load_bundle(tmp_path)
    write_bundle(tmp_path, *localized)
    (tmp_path / MODEL_FILE).unlink()
    with pytest.raises(FilterForwardError, match=r"has no model\.onnx"):
        load_bundle(tmp_path)


def with_nodes(onnx_bytes: bytes, nodes: list[onnx.NodeProto]) -> bytes:
    """The model with more nodes (their outputs unused: ONNX Runtime would prune them, the check sees them)."""
    model = onnx.load_model_from_string(onnx_bytes)
    model.graph.node.extend(nodes)
    return model.SerializeToString()


def doubling(first: str, times: int) -> list[onnx.NodeProto]:
    """`times` Concats, each of the one before with itself: a tensor 2**times as large as `first`."""
    names = [first, *(f"doubled{n}" for n in range(times))]
    return [onnx.helper.make_node("Concat", [a, a], [b], axis=1) for a, b in itertools.pairwise(names)]


def test_models_that_loop_or_grow_huge_tensors_are_refused_before_they_run(localized: tuple[FilterSpec, bytes]) -> None:
    """A model of 279 bytes asking ConstantOfShape for 250 M floats took the cloud to 2 GB on its dry run (and was
    accepted, for every edge to run on every frame); one with a Loop of 10**15 iterations hung the API."""
    spec, onnx_bytes = localized
    shape = onnx.helper.make_tensor("size", onnx.TensorProto.INT64, [1], [250_000_000])
    bomb = [onnx.helper.make_node("Constant", [], ["size"], value=shape),
            onnx.helper.make_node("ConstantOfShape", ["size"], ["zeros"])]  # fmt: skip
    with pytest.raises(FilterForwardError, match="uses ConstantOfShape, which a microclassifier does not need"):
        check_mc_model(spec, with_nodes(onnx_bytes, bomb), tap_shape("mid"))
    crop = int(np.prod(crop_shape(spec, tap_shape("mid"))))  # 10080 elements: 2**13 of it is over 64 M
    with pytest.raises(FilterForwardError) as refused:
        check_mc_model(spec, with_nodes(onnx_bytes, doubling("features", 15)), tap_shape("mid"))
    assert str(refused.value) == (
        f"the MC model's tensor 'doubled12' has {crop * 2**13} elements on one frame, over the limit of {2**26}: use "
        "a smaller MC"
    )


@pytest.mark.parametrize("location", ["etc/passwd", "cloud.yaml", "../secret.bin"])
def test_a_model_with_external_weights_is_refused_without_looking_for_them(
    localized: tuple[FilterSpec, bytes], location: str
) -> None:
    """The checker looked for the files on the cloud's disk: whether one existed changed the error an uploader got."""
    spec, onnx_bytes = localized
    model = onnx.load_model_from_string(onnx_bytes)
    weights = model.graph.initializer[0]
    weights.ClearField("raw_data")
    weights.data_location = onnx.TensorProto.EXTERNAL
    weights.external_data.add(key="location", value=location)
    with pytest.raises(FilterForwardError) as refused:
        check_mc_model(spec, model.SerializeToString(), tap_shape("mid"))
    assert str(refused.value) == "the MC model keeps weights in external files: export it with its weights inside"


def test_a_dry_run_that_takes_too_long_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    features = onnx.helper.make_tensor_value_info("features", onnx.TensorProto.FLOAT, [1, 40, 9, 10])
    score = onnx.helper.make_tensor_value_info("score", onnx.TensorProto.FLOAT, [])
    nodes = [*doubling("features", 14), onnx.helper.make_node("ReduceMax", ["doubled13"], ["score"], keepdims=0)]
    graph = onnx.helper.make_graph(nodes, "slow", [features], [score])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"features": np.ones((1, 40, 9, 10), np.float32)}
    assert run_with_deadline(session, feeds)[0] == 1.0  # in time
    monkeypatch.setattr(mc_limits, "DRY_RUN_SECONDS", 0.002)  # far less than its 14 copies of up to 236 MB take
    with pytest.raises(FilterForwardError, match=r"the MC model ran over 0.002 s on one frame: use a smaller MC"):
        run_with_deadline(session, feeds)
