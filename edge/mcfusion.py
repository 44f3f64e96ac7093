"""Fusion of microclassifiers: the MCs that read one tap merged into one ONNX graph, run as one session.

Each MC is a tiny graph, so running them one ONNX Runtime session at a time spends more on per-run
overhead (input binding, output allocation, thread hand-offs) than on arithmetic. A fused graph takes the
whole tap [1, C, H, W] once, slices each ROI inside the graph (one Slice per distinct ROI, shared by the MCs
that read it), runs every MC's own nodes under a per-MC name prefix and returns every score (and each
windowed MC's reduction) from a single run. The MCs' ONNX bytes are used as loaded: nothing is retrained or
re-exported, and the scores equal those of the MCs run alone.

With int8 weights (the edge's `mc_weights: int8`), the fused graph's fully connected layers (MatMul, Gemm: the
localized and windowed heads' FC, about 1.6 MB of fp32 weights each, which make a bank of them memory-bound) keep
their weights in int8 and quantize their input per frame (ONNX Runtime's dynamic quantization): a quarter of the
bytes each MC moves, scores within about 1e-3 of fp32. Convolutions stay fp32 (dynamically quantized, 50 fused MCs
ran 5-8x slower in ONNX Runtime 1.32), so full-frame MCs and the default filter are unchanged.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, compose, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from models.base_runtime import session_options
from models.bundle import FEATURES_INPUT, HISTORY_INPUT, REDUCED_OUTPUT, SCORE_OUTPUT
from models.mc_kinds import MCWeights

log = logging.getLogger(__name__)

TAP_INPUT = "tap"
DEFAULT_DOMAINS = ("", "ai.onnx")
FC_OPS = ("MatMul", "Gemm")


class FusableMC(Protocol):
    """What fusion needs of a loaded MC (edge.mcbank.LoadedMC provides it)."""

    @property
    def name(self) -> str: ...

    @property
    def onnx_bytes(self) -> bytes: ...

    @property
    def rows(self) -> slice: ...

    @property
    def cols(self) -> slice: ...

    @property
    def history_shape(self) -> tuple[int, ...] | None: ...

    @property
    def history_key(self) -> str: ...


@dataclass(frozen=True)
class Member:
    """One MC inside a fused graph: where its crop lies and the graph's names for its inputs and outputs."""

    name: str
    score: str
    history: str | None = None  # windowed MCs only
    reduced: str | None = None
    history_shape: tuple[int, ...] | None = None
    history_key: str = ""  # the loaded model's key in a camera's histories


@dataclass(frozen=True, eq=False)
class FusedGraph:
    """Several MCs on one tap as one ONNX Runtime session."""

    tap: str
    session: ort.InferenceSession
    members: tuple[Member, ...]

    # Read on every frame: worked out once.
    @cached_property
    def names(self) -> frozenset[str]:
        return frozenset(member.name for member in self.members)

    @cached_property
    def windowed(self) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.history is not None)

    @cached_property
    def outputs(self) -> list[str]:
        return [m.score for m in self.members] + [m.reduced for m in self.windowed]

    def run(self, tap: np.ndarray, histories: dict[str, np.ndarray]) -> dict[str, float]:
        """Every member's score on one frame's tap [1, C, H, W]; advances the windowed members' histories."""
        feeds = {TAP_INPUT: tap}
        for m in self.windowed:
            feeds[m.history] = window_history(histories, m.history_key, m.history_shape)
        values = self.session.run(self.outputs, feeds)
        scores, reductions = values[: len(self.members)], values[len(self.members) :]
        for m, reduced in zip(self.windowed, reductions, strict=True):
            push_history(histories, m.history_key, feeds[m.history], reduced)
        return {m.name: float(score.reshape(-1)[0]) for m, score in zip(self.members, scores, strict=True)}


def window_history(histories: dict[str, np.ndarray], key: str, shape: tuple[int, ...]) -> np.ndarray:
    """A windowed MC's history for this frame: zeros until its first frame."""
    history = histories.get(key)
    if history is None or history.shape != shape:
        history = np.zeros(shape, np.float32)
    return history


def push_history(histories: dict[str, np.ndarray], key: str, history: np.ndarray, reduced: np.ndarray) -> None:
    """Oldest frame out, this frame's reduction in: the ring buffer the next frame sees."""
    width = reduced.shape[1]
    histories[key] = np.concatenate([history[:, width:], reduced], axis=1)


def default_opset(onnx_bytes: bytes) -> int | None:
    """The ONNX opset of a model's default domain: only MCs with the same one can share a graph."""
    model = onnx.load_model_from_string(onnx_bytes)
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)


def fuse(
    tap: str, tap_shape: tuple[int, int, int], mcs: Sequence[FusableMC], weights: MCWeights = "fp32"
) -> FusedGraph:
    """One single-threaded session running every MC of `mcs` (same tap, same default opset) on the full tap, its
    fully connected layers' weights in int8 if `weights` says so.

    Raises whatever onnx or ONNX Runtime raise when the merged graph is not valid: callers fall back to
    running the MCs alone.
    """
    model = fused_model(tap_shape, mcs)
    if weights == "int8":
        model = int8_fc_weights(model)
    session = ort.InferenceSession(
        model.SerializeToString(), session_options(threads=1), providers=["CPUExecutionProvider"]
    )
    return FusedGraph(tap, session, tuple(_member(i, mc) for i, mc in enumerate(mcs)))


def fused_model(tap_shape: tuple[int, int, int], mcs: Sequence[FusableMC]) -> onnx.ModelProto:
    """The merged ONNX model: input `tap` [1, C, H, W] (+ one history per windowed MC), all MC outputs."""
    graph = helper.make_graph(
        [], "fused_mcs", [helper.make_tensor_value_info(TAP_INPUT, TensorProto.FLOAT, [1, *tap_shape])], []
    )
    crops: dict[tuple[int, int, int, int], str] = {}
    subs = [compose.add_prefix(onnx.load_model_from_string(mc.onnx_bytes), _prefix(i)) for i, mc in enumerate(mcs)]
    for i, (mc, sub) in enumerate(zip(mcs, subs, strict=True)):
        features = _prefix(i) + FEATURES_INPUT
        graph.node.append(helper.make_node("Identity", [_crop(graph, crops, tap_shape, mc.rows, mc.cols)], [features]))
        graph.node.extend(sub.graph.node)
        graph.initializer.extend(sub.graph.initializer)
        graph.sparse_initializer.extend(sub.graph.sparse_initializer)
        graph.value_info.extend(sub.graph.value_info)
        graph.input.extend(v for v in sub.graph.input if v.name != features)
        graph.output.extend(sub.graph.output)
    fused = helper.make_model(
        graph,
        opset_imports=_opsets(subs),
        ir_version=max(m.ir_version for m in subs),
        functions=[f for m in subs for f in m.functions],
    )
    return fused  # ONNX Runtime validates it when the session opens: a second check would double the build time


class _QuantizerAdvice(logging.Filter):
    """Drops ONNX Runtime's quantizer advice to pre-process the model (shape inference), logged on the root logger
    at every call: a fused MC graph is tiny and has its shapes, and an edge rebuilds graphs at every filter change."""

    def filter(self, record: logging.LogRecord) -> bool:
        quantizer = "onnxruntime" in record.pathname and "quantization" in record.pathname
        return not (quantizer and "pre-processing before quantization" in record.getMessage())


logging.getLogger().addFilter(_QuantizerAdvice())


def int8_fc_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the weights of its MatMul and Gemm nodes in int8 (per tensor), their inputs quantized per
    run; a model without such nodes as it is."""
    if not any(node.op_type in FC_OPS for node in model.graph.node):
        return model
    with tempfile.TemporaryDirectory(prefix="ff-mc-int8-") as folder:
        path = Path(folder) / "int8.onnx"  # quantize_dynamic writes a file, never returns the model
        quantize_dynamic(model, path, op_types_to_quantize=list(FC_OPS), weight_type=QuantType.QInt8)
        return onnx.load(path)


def _prefix(index: int) -> str:
    return f"mc{index}/"


def _member(index: int, mc: FusableMC) -> Member:
    prefix = _prefix(index)
    if mc.history_shape is None:
        return Member(mc.name, prefix + SCORE_OUTPUT)
    names = (prefix + SCORE_OUTPUT, prefix + HISTORY_INPUT, prefix + REDUCED_OUTPUT)
    return Member(mc.name, *names, mc.history_shape, mc.history_key)


def _crop(
    graph: onnx.GraphProto,
    crops: dict[tuple[int, int, int, int], str],
    tap_shape: tuple[int, int, int],
    rows: slice,
    cols: slice,
) -> str:
    """The name of the tap cropped to (rows, cols), adding its Slice to the graph the first time it is needed."""
    key = (rows.start, rows.stop, cols.start, cols.stop)
    if key == (0, tap_shape[1], 0, tap_shape[2]):
        return TAP_INPUT  # a full-frame ROI reads the tap as it is
    if key not in crops:
        name = f"crop{len(crops)}"
        starts, ends, axes = (f"{name}_{part}" for part in ("starts", "ends", "axes"))
        graph.initializer.extend(
            numpy_helper.from_array(np.array(values, np.int64), label)
            for label, values in ((starts, key[0::2]), (ends, key[1::2]), (axes, (2, 3)))
        )
        graph.node.append(helper.make_node("Slice", [TAP_INPUT, starts, ends, axes], [name]))
        crops[key] = name
    return crops[key]


def _opsets(models: Sequence[onnx.ModelProto]) -> list[onnx.OperatorSetIdProto]:
    """The union of the models' opset imports; ValueError when two need different versions of a domain."""
    versions: dict[str, int] = {}
    for model in models:
        for opset in model.opset_import:
            domain = "" if opset.domain in DEFAULT_DOMAINS else opset.domain
            if versions.setdefault(domain, opset.version) != opset.version:
                raise ValueError(
                    f"MCs import opset {domain or 'ai.onnx'} at versions {versions[domain]} and {opset.version}"
                )
    return [helper.make_opsetid(domain, version) for domain, version in versions.items()]
