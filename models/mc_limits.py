"""What an uploaded MC model may cost: the cloud checks every filter with a dry run, and the edges run it on every
frame, so a graph that loops, makes tensors from runtime values or grows a huge one is refused before it runs (one
such upload hung the cloud's API; another took 2 GB on each run)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import onnx
import onnxruntime as ort
from onnx import shape_inference

from models.errors import FilterForwardError

# Control flow that repeats, and ops whose output size comes from a tensor's values (a small model can ask for
# gigabytes): no microclassifier needs them. (An ensemble's export holds an If, which runs one branch once.)
REFUSED_OPS = frozenset({
    "Loop", "Scan", "ConstantOfShape", "Expand", "Tile", "Range", "NonZero", "Resize", "Upsample", "Compress",
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
})  # fmt: skip
MAX_NODES = 10_000  # the paper's kinds have 8-18, an ensemble's export about 30
MAX_TENSOR_ELEMENTS = 1 << 26  # 256 MB in float32; an MC's largest tensor is its input crop, about 0.3 M
DRY_RUN_SECONDS = 20.0  # an MC runs in well under a second on one frame


def check_graph(model: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]) -> None:
    """Refuse a graph with a refused op or too many nodes, or one in which a tensor whose shape ONNX's shape
    inference can tell (for these input shapes) is too large."""
    nodes = list(_nodes(model.graph))
    if len(nodes) > MAX_NODES:
        raise FilterForwardError(
            f"the MC model has {len(nodes)} nodes, over the limit of {MAX_NODES}: use a smaller MC"
        )
    if refused := sorted({node.op_type for node in nodes} & REFUSED_OPS):
        raise FilterForwardError(
            f"the MC model uses {', '.join(refused)}, which a microclassifier does not need (loops and tensors sized "
            "at run time are refused): export it without"
        )
    for name, elements in _tensor_sizes(model, inputs):
        if elements > MAX_TENSOR_ELEMENTS:
            raise FilterForwardError(
                f"the MC model's tensor {name!r} has {elements} elements on one frame, over the limit of "
                f"{MAX_TENSOR_ELEMENTS}: use a smaller MC"
            )


def check_self_contained(model: onnx.ModelProto) -> None:
    """Refuse weights kept in files beside the model: an upload has none, and the paths would be read on the cloud's
    disk (whether a file exists there changed the error an uploader got back)."""
    tensors = [*model.graph.initializer, *(a.t for node in _nodes(model.graph) for a in node.attribute if a.t.name)]
    if any(tensor.data_location == onnx.TensorProto.EXTERNAL for tensor in tensors):
        raise FilterForwardError("the MC model keeps weights in external files: export it with its weights inside")


def run_with_deadline(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """session.run, stopped (FilterForwardError) if it takes over DRY_RUN_SECONDS."""
    options = ort.RunOptions()
    timer = threading.Timer(DRY_RUN_SECONDS, lambda: setattr(options, "terminate", True))
    timer.start()
    try:
        return session.run(None, feeds, options)
    except Exception:  # ONNX Runtime's own exception types
        if options.terminate:
            raise FilterForwardError(
                f"the MC model ran over {DRY_RUN_SECONDS:g} s on one frame: use a smaller MC"
            ) from None
        raise
    finally:
        timer.cancel()


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, those of subgraphs (an If's branches) included."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs] if attribute.type in _GRAPH_TYPES else []:
                yield from _nodes(subgraph)


_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def _tensor_sizes(model: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]) -> Iterator[tuple[str, int]]:
    """(name, elements) of every tensor whose shape inference tells, the graph's inputs fixed to `inputs`."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for graph_input in fixed.graph.input:
        if graph_input.name in inputs:
            dims = graph_input.type.tensor_type.shape.dim
            for dim, size in zip(dims, inputs[graph_input.name], strict=False):
                dim.Clear()
                dim.dim_value = size
    try:
        inferred = shape_inference.infer_shapes(fixed, data_prop=True)
    except Exception:  # inference refuses some valid graphs: the dry run's deadline still holds
        return
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims and all(dim.HasField("dim_value") for dim in dims):
            yield value.name, int(np.prod([dim.dim_value for dim in dims], dtype=np.int64))
