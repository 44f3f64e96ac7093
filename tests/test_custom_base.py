"""A user-supplied ONNX base model with named taps replaces EfficientNet-Lite0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.mcbank import CameraState, MCBank
from filterforward.cli import main
from models.basednn import BaseDNN
from models.bundle import FEATURES_INPUT, SCORE_OUTPUT
from models.errors import FilterForwardError
from models.filterspec import FilterSpec


def conv(
    name: str, source: str, cin: int, cout: int, rng: np.random.Generator
) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    weight = numpy_helper.from_array(rng.normal(size=(cout, cin, 3, 3)).astype(np.float32) / 10, f"{name}_w")
    node = helper.make_node("Conv", [source, weight.name], [name], strides=[2, 2], pads=[1, 1, 1, 1])
    return node, weight


def write_base(path: Path, input_name: str = "image") -> Path:
    """uint8 NHWC BGR in; taps `edges` (stride 2, 4 ch) and `coarse` (stride 4, 8 ch) out."""
    rng = np.random.default_rng(0)
    edges, w1 = conv("edges", "x", 3, 4, rng)
    coarse, w2 = conv("coarse", "edges", 4, 8, rng)
    nodes = [
        helper.make_node("Cast", [input_name], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["xf"], ["x"], perm=[0, 3, 1, 2]),
        edges,
        coarse,
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-base",
        [helper.make_tensor_value_info(input_name, TensorProto.UINT8, ["n", "h", "w", 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("edges", "coarse")],
        initializer=[w1, w2],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def max_pool_mc(channels: int, cells: tuple[int, int]) -> bytes:
    """A hand-written MC: sigmoid of the global max of the mean over channels."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", [FEATURES_INPUT], ["mean"], axes=[1], keepdims=0),
            helper.make_node("ReduceMax", ["mean"], ["peak"], axes=[1, 2], keepdims=0),
            helper.make_node("Sigmoid", ["peak"], [SCORE_OUTPUT]),
        ],
        "tiny-mc",
        [helper.make_tensor_value_info(FEATURES_INPUT, TensorProto.FLOAT, ["batch", channels, *cells])],
        [helper.make_tensor_value_info(SCORE_OUTPUT, TensorProto.FLOAT, ["batch"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_custom_base_model_taps_are_discovered_and_feed_mcs(tmp_path: Path) -> None:
    base = BaseDNN((64, 32), write_base(tmp_path / "tiny.onnx"))
    assert {name: (tap.channels, tap.stride) for name, tap in base.taps.items()} == {"edges": (4, 2), "coarse": (8, 4)}
    frame = np.full((32, 64, 3), 200, np.uint8)
    taps = base.run(frame)
    assert taps["edges"].shape == (1, 4, 16, 32) and taps["coarse"].shape == (1, 8, 8, 16)
    assert base.identity.name == "tiny" and base.identity.precision == "fp32"  # no metadata: its file's stem

    bank = MCBank(base.taps, base.input_size)
    spec = FilterSpec(name="bright", architecture="full_frame", tap="coarse", input_size=(64, 32))
    bank.put(spec, max_pool_mc(8, (8, 16)))
    scores = bank.score(bank.active("cam"), taps, frame, CameraState())
    logit = np.log(scores["bright"] / (1 - scores["bright"]))
    # ONNX Runtime's vectorised sigmoid is approximate far in the tails, hence the loose tolerance.
    assert logit == pytest.approx(float(taps["coarse"][0].mean(axis=0).max()), abs=0.02)


def test_a_base_model_without_an_image_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FilterForwardError, match="one input named 'image'"):
        BaseDNN((64, 32), write_base(tmp_path / "bad.onnx", input_name="pixels_in"))


def test_a_base_model_path_that_is_no_file_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command that takes --base-model checks it the same way (models info as train and eval)."""
    for path, what in ((tmp_path, "is a folder"), (tmp_path / "none.onnx", "does not exist")):
        assert main(["models", "info", "--base-model", str(path)]) == 2
        hint = "give the path of an ONNX file with named taps"
        assert capsys.readouterr().err.strip() == f"filterforward models: error: base model {path} {what}: {hint}"
        with pytest.raises(FilterForwardError, match=f"base model .* {what}: give the path of an ONNX file"):
            BaseDNN((64, 32), path)
