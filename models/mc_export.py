"""Export a trained microclassifier to ONNX (the edge's format) and check that ONNX Runtime agrees with torch."""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import onnxruntime as ort
import torch

from models.bundle import io_names
from models.mc_kinds import MC_KINDS
from models.microclassifiers import MicroClassifier

log = logging.getLogger(__name__)

OPSET = 17


def mc_io_names(model: MicroClassifier) -> tuple[list[str], list[str]]:
    """ONNX input and output names of an MC: those models.bundle checks for its kind."""
    return io_names(MC_KINDS.lookup(model.architecture))


def export_mc(model: MicroClassifier, crop_chw: tuple[int, int, int]) -> bytes:
    """The MC as ONNX bytes: opset 17, dynamic batch, static crop shape."""
    inputs, outputs = mc_io_names(model)
    return to_onnx(model, model.example_inputs(crop_chw), inputs, outputs)


def to_onnx(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    inputs: list[str],
    outputs: list[str],
    opset: int = OPSET,
) -> bytes:
    """Any module as ONNX bytes with a dynamic batch dimension on every input and output."""
    buffer = io.BytesIO()
    # The TorchScript exporter (dynamo=False) on purpose: it gives a small static graph for these tiny modules.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module.eval(),
            example,
            buffer,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes={name: {0: "batch"} for name in inputs + outputs},
            opset_version=opset,
            dynamo=False,
        )
    return buffer.getvalue()


def verify_export(
    model: MicroClassifier, onnx_bytes: bytes, crop_chw: tuple[int, int, int], atol: float = 1e-5, batch: int = 3
) -> float:
    """Run torch and ONNX Runtime on the same random batch; the largest difference, or RuntimeError."""
    torch.manual_seed(0)
    inputs = model.example_inputs(crop_chw, batch)
    names, _ = mc_io_names(model)
    with torch.no_grad():
        expected = model.eval()(*inputs)
    expected = [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    got = session.run(None, {name: x.numpy() for name, x in zip(names, inputs, strict=True)})
    worst = 0.0
    for want, have in zip(expected, got, strict=True):
        if want.shape != have.shape:
            raise RuntimeError(f"exported MC output has shape {have.shape}, torch gives {want.shape}")
        # Scores are probabilities (absolute tolerance); reductions can be large (relative part).
        excess = np.abs(have - want) - (atol + 1e-4 * np.abs(want))
        worst = max(worst, float(np.abs(have - want).max()))
        if (excess > 0).any():
            raise RuntimeError(f"exported MC differs from torch by {worst:.2e} (tolerance {atol:.0e})")
    log.debug("ONNX export matches torch within %.2e", worst)
    return worst


def export_constant_mc(model: MicroClassifier, crop_chw: tuple[int, int, int], logit: float) -> bytes:
    """`model` exported with its last layer zeroed and its bias set to `logit`: it scores sigmoid(logit) on
    every frame. A filter that sends every frame (logit > 0) or none, for smoke tests, benchmarks and
    record-everything filters; it still runs (and costs) like a trained MC of its architecture."""
    last = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(logit)
    return export_mc(model, crop_chw)
