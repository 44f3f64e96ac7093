"""What runs the base model's graph: ONNX Runtime's CPU provider, or OpenVINO for the reduced precisions.

fp32 always runs on ONNX Runtime. int8 (a QDQ graph, models/base_precision.py) runs on OpenVINO where the
[openvino] extra is installed and the CPU does int8 (its kernels are faster, see bench/base_precision.py) and on
ONNX Runtime anywhere else, ARM included. bf16 is the fp32 graph run with bf16 arithmetic, which needs OpenVINO
and a CPU that does bf16 (AVX512-BF16 or AMX on x86); lacking either, it runs in fp32 on ONNX Runtime: the
fp32 model's features (bf16's differ from them by rounding only), about half the speed, said once in the log.

Neither runtime skips the nodes a run's outputs do not need (ONNX Runtime ran EfficientNet-Lite0 for its `early`
tap alone as long as for all four outputs), so a runner can be opened on the graph pruned to some outputs: at
768x448 the `mid` tap alone then took 34 ms against 46 (fp32) and 24 against 32 (int8), the same values.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import onnx
import onnxruntime as ort
from onnx.utils import Extractor

from models.errors import FilterForwardError
from models.taps import IMAGE_INPUT

log = logging.getLogger(__name__)

Runtime = Literal["onnxruntime", "openvino"]
RUNTIMES: tuple[str, ...] = ("auto", "onnxruntime", "openvino")
OPENVINO_EXTRA = "pip install 'filterforward[openvino]'"


@dataclass(frozen=True)
class Choice:
    """The runtime for a base model, OpenVINO's arithmetic for it, and why that falls short of the precision."""

    runtime: Runtime
    arithmetic: Literal["f32", "bf16"] = "f32"
    shortfall: str = ""


def choose(precision: str, openvino_capabilities: frozenset[str] | None, wanted: str = "auto") -> Choice:
    """Pick how to run a model of `precision`; `openvino_capabilities` is None where OpenVINO is not installed,
    else the CPU's OPTIMIZATION_CAPABILITIES as OpenVINO reports them (e.g. {"FP32", "INT8", "BF16"})."""
    if wanted not in RUNTIMES:
        raise FilterForwardError(f"runtime {wanted!r} is not one of {', '.join(RUNTIMES)}")
    capabilities = openvino_capabilities or frozenset()
    if wanted == "openvino" and openvino_capabilities is None:
        raise FilterForwardError(f"runtime openvino was asked for but OpenVINO is not installed: {OPENVINO_EXTRA}")
    if wanted == "auto":
        # OpenVINO only where the CPU does the precision natively: elsewhere ONNX Runtime is as fast, and for
        # a bf16 model its fp32 gives exactly the fp32 model's features.
        native = {"int8": "INT8", "bf16": "BF16"}.get(precision, "")
        wanted = "openvino" if native in capabilities else "onnxruntime"
    if precision != "bf16":
        return Choice(wanted)
    if wanted == "openvino" and "BF16" in capabilities:
        return Choice("openvino", "bf16")
    if openvino_capabilities is None:
        reason = "OpenVINO is not installed"
    elif "BF16" not in capabilities:
        reason = "this CPU has no bf16 arithmetic (AVX512-BF16 or AMX)"
    else:
        reason = "ONNX Runtime was asked for"
    return Choice(wanted, shortfall=f"{reason}, so this bf16 model runs in fp32 (correct, about 2x slower)")


def openvino_capabilities() -> frozenset[str] | None:
    """What OpenVINO's CPU plugin can do here, or None when OpenVINO is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return frozenset(openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def session_options(threads: int | None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    # Idle pool threads would otherwise spin after each run and hold the cores the MC bank needs next.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class Runner(Protocol):
    output_names: list[str]
    description: str  # what runs it, for logs and `filterforward models info`

    def run(self, names: Sequence[str], batch: np.ndarray) -> list[np.ndarray]: ...


def check_inputs(path: Path, names: list[str]) -> None:
    if names != [IMAGE_INPUT]:
        raise FilterForwardError(
            f"base model {path} must have one input named '{IMAGE_INPUT}' (uint8 NHWC BGR), found {names}"
        )


ModelSource = Path | bytes  # an ONNX file, or a graph in memory (pruned to some outputs)


def pruned(path: Path, outputs: Sequence[str]) -> bytes:
    """The model at `path` reduced to the nodes that compute `outputs` (its other outputs are dropped)."""
    return Extractor(onnx.load(str(path))).extract_model([IMAGE_INPUT], list(outputs)).SerializeToString()


def _readable(source: ModelSource) -> str | bytes:
    """What both runtimes read: a file's path as a string, or the graph's bytes."""
    return str(source) if isinstance(source, Path) else source


class OnnxRuntimeRunner:
    """`path` names the model in messages; `source` is what runs (the file, or its graph pruned to some outputs)."""

    def __init__(self, path: Path, threads: int | None, source: ModelSource):
        options = session_options(threads)
        self.session = ort.InferenceSession(_readable(source), options, providers=["CPUExecutionProvider"])
        check_inputs(path, [i.name for i in self.session.get_inputs()])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.description = f"onnxruntime {ort.__version__}, CPU provider"

    def run(self, names: Sequence[str], batch: np.ndarray) -> list[np.ndarray]:
        return self.session.run(list(names), {IMAGE_INPUT: batch})


class OpenVinoRunner:
    """The graph compiled for one input size (static shapes are what OpenVINO's CPU plugin runs fastest)."""

    def __init__(
        self,
        path: Path,
        threads: int | None,
        input_size: tuple[int, int],
        arithmetic: str,
        source: ModelSource,
    ):
        import openvino

        core = openvino.Core()
        model = core.read_model(_readable(source))
        check_inputs(path, [i.get_any_name() for i in model.inputs])
        self.output_names = [o.get_any_name() for o in model.outputs]
        width, height = input_size
        model.reshape({IMAGE_INPUT: [1, height, width, 3]})
        config: dict[str, object] = {"INFERENCE_PRECISION_HINT": arithmetic, "PERFORMANCE_HINT": "LATENCY"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.compiled = core.compile_model(model, "CPU", config)
        self.description = f"openvino {openvino.__version__}, CPU, {arithmetic} arithmetic"
        self._local = threading.local()  # an infer request serves one thread at a time; cameras run in several

    def run(self, names: Sequence[str], batch: np.ndarray) -> list[np.ndarray]:
        request = getattr(self._local, "request", None) or self._new_request()
        per_frame = []
        for image in batch:
            result = request.infer({IMAGE_INPUT: image[None]})
            # The request reuses its output buffers on the next frame: copy what the caller keeps.
            per_frame.append([np.array(result[self.compiled.output(name)]) for name in names])
        return [np.concatenate(arrays) for arrays in zip(*per_frame, strict=True)]

    def _new_request(self) -> object:
        self._local.request = self.compiled.create_infer_request()
        return self._local.request


def open_runner(
    path: Path,
    precision: str,
    input_size: tuple[int, int],
    threads: int | None,
    wanted: str,
    outputs: Sequence[str] | None = None,
) -> Runner:
    """A runner for the model at `path`, chosen by its precision and what this machine has (see `choose`); with
    `outputs`, for the graph pruned to those outputs (the warnings are the whole model's, not repeated)."""
    choice = choose(precision, openvino_capabilities(), wanted)
    if choice.shortfall and outputs is None:
        log.warning("base model %s: %s", path.name, choice.shortfall)
    try:
        source = pruned(path, outputs) if outputs is not None else path
        runner = (
            OpenVinoRunner(path, threads, input_size, choice.arithmetic, source)
            if choice.runtime == "openvino"
            else OnnxRuntimeRunner(path, threads, source)
        )
    except FilterForwardError:
        raise
    except Exception as exc:  # both runtimes raise their own exception types for unreadable models
        raise FilterForwardError(f"base model {path} does not load in {choice.runtime}: {exc}") from exc
    if outputs is None:
        log.info("base model %s (%s) runs on %s", path.name, precision, runner.description)
    else:
        log.info("base model %s pruned to %s for the filters that read only those", path.name, ", ".join(outputs))
    return runner
