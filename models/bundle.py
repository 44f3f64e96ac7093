"""Filter bundles (a folder with spec.json + model.onnx) and the check that an MC's ONNX fits its spec.

No torch here: the edge loads bundles and the cloud checks uploaded weights with ONNX Runtime only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from pydantic import ValidationError

from models.cache import write_whole
from models.errors import FilterForwardError, validation_summary
from models.filterspec import FilterSpec
from models.mc_kinds import MC_KINDS, MCKind
from models.mc_limits import check_graph, check_self_contained, run_with_deadline

log = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
MODEL_FILE = "model.onnx"
# The ONNX contract of an MC (see models/microclassifiers.py).
FEATURES_INPUT = "features"
HISTORY_INPUT = "history"
SCORE_OUTPUT = "score"
REDUCED_OUTPUT = "reduced"
MAX_MODEL_BYTES = 16 * 1024 * 1024
OPSET_RANGE = (13, 21)


def write_bundle(path: Path, spec: FilterSpec, onnx_bytes: bytes) -> Path:
    """Write (or overwrite) the bundle folder `path`."""
    path = Path(path)
    write_whole(path, {MODEL_FILE: onnx_bytes, SPEC_FILE: (spec.model_dump_json(indent=2) + "\n").encode()})
    log.info("wrote filter bundle %s (%s, %d bytes of ONNX)", path, spec.name, len(onnx_bytes))
    return path


def load_bundle(path: Path) -> tuple[FilterSpec, bytes]:
    """Read a bundle folder; its spec is validated strictly, its model only read (see check_mc_model)."""
    path = Path(path)
    if not path.is_dir():
        raise FilterForwardError(
            f"filter bundle {path} is not a folder: give a folder with {SPEC_FILE} and {MODEL_FILE}"
        )
    spec = parse_spec(path / SPEC_FILE)
    model_path = path / MODEL_FILE
    if not model_path.is_file():
        raise FilterForwardError(f"filter bundle {path} has no {MODEL_FILE}: train or export the MC into it")
    if model_path.stat().st_size > MAX_MODEL_BYTES:
        raise FilterForwardError(_too_big(model_path.stat().st_size))
    return spec, model_path.read_bytes()


def load_bundles(paths: Iterable[Path]) -> list[tuple[FilterSpec, bytes]]:
    """Bundles that run side by side: two of one name would be one filter twice over (the bank keys filters, and
    events and scores name them, by name), so that is refused."""
    loaded: dict[str, tuple[Path, FilterSpec, bytes]] = {}
    for path in paths:
        spec, onnx_bytes = load_bundle(path)
        if spec.name in loaded:
            raise FilterForwardError(
                f"filter bundles {loaded[spec.name][0]} and {path} are both named {spec.name!r}: "
                "drop one, or train one again with another --name"
            )
        loaded[spec.name] = (path, spec, onnx_bytes)
    return [(spec, onnx_bytes) for _, spec, onnx_bytes in loaded.values()]


def parse_spec(path: Path) -> FilterSpec:
    if not path.is_file():
        raise FilterForwardError(f"{path} is missing: a filter bundle needs its {SPEC_FILE}")
    try:
        return FilterSpec.model_validate(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise FilterForwardError(f"{path} is not valid JSON ({exc}); fix or rewrite it") from None
    except ValidationError as exc:
        raise FilterForwardError(f"{path} is not a valid filter spec: {validation_summary(exc, 'spec')}") from None


def io_names(kind: MCKind) -> tuple[list[str], list[str]]:
    """ONNX input and output names of an MC of this kind: a windowed one also passes its history in and out."""
    if kind.windowed:
        return [FEATURES_INPUT, HISTORY_INPUT], [SCORE_OUTPUT, REDUCED_OUTPUT]
    return [FEATURES_INPUT], [SCORE_OUTPUT]


def crop_shape(spec: FilterSpec, tap_shape_chw: tuple[int, int, int]) -> tuple[int, int, int]:
    """(C, h, w) of the spec's ROI on a tap of shape (C, H, W)."""
    channels, height, width = tap_shape_chw
    return channels, *spec.roi.cell_shape(height, width)


def check_mc_model(spec: FilterSpec, onnx_bytes: bytes, tap_shape_chw: tuple[int, int, int]) -> None:
    """Raise FilterForwardError unless the ONNX model is a valid MC for `spec` on a tap of this shape.

    `tap_shape_chw` is the full tap at the spec's input size; the model must take its ROI crop.
    """
    if len(onnx_bytes) > MAX_MODEL_BYTES:
        raise FilterForwardError(_too_big(len(onnx_bytes)))
    kind = MC_KINDS[spec.architecture]
    if kind.windowed and spec.window < 2:
        raise FilterForwardError(f"a windowed MC needs window >= 2 in its spec, got {spec.window}")
    crop = crop_shape(spec, tap_shape_chw)
    check_graph(_load(onnx_bytes), {FEATURES_INPUT: (1, *crop)})  # before ONNX Runtime folds its constants
    session = _session(onnx_bytes)
    input_names, output_names = io_names(kind)
    _check_names("inputs", [i.name for i in session.get_inputs()], input_names)
    _check_names("outputs", [o.name for o in session.get_outputs()], output_names)
    inputs = {i.name: i for i in session.get_inputs()}
    feeds = {FEATURES_INPUT: _zeros_for(inputs[FEATURES_INPUT], crop, spec)}
    if kind.windowed:
        reduced = _reduced_channels(session, spec)
        history = ((spec.window - 1) * reduced, *crop[1:])
        feeds[HISTORY_INPUT] = _zeros_for(inputs[HISTORY_INPUT], history, spec)
    _check_dry_run(session, feeds, crop, spec)


def _load(onnx_bytes: bytes) -> onnx.ModelProto:
    try:
        model = onnx.load_model_from_string(onnx_bytes)
        check_self_contained(model)  # before the checker, which would look for the files
        onnx.checker.check_model(model)
    except FilterForwardError:
        raise
    except Exception as exc:  # protobuf and the checker raise several unrelated types for a bad file
        raise FilterForwardError(f"the MC model is not a valid ONNX file ({_first_line(exc)}); re-export it") from None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    low, high = OPSET_RANGE
    if opset is None or not low <= opset <= high:
        raise FilterForwardError(f"the MC model uses ONNX opset {opset}; export it with an opset from {low} to {high}")
    return model


def _session(onnx_bytes: bytes) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime's own exception types
        raise FilterForwardError(f"the MC model does not load in ONNX Runtime: {_first_line(exc)}") from None


def _check_names(kind: str, found: list[str], expected: list[str]) -> None:
    if sorted(found) != sorted(expected):
        raise FilterForwardError(f"the MC model has {kind} {found}, expected exactly {expected}")


def _zeros_for(meta: ort.NodeArg, shape_chw: tuple[int, ...], spec: FilterSpec) -> np.ndarray:
    """A one-frame zero input after checking the declared type and shape (symbolic dims fit anything)."""
    if meta.type != "tensor(float)":
        raise FilterForwardError(f"MC input '{meta.name}' is {meta.type}; it must be float32")
    declared = list(meta.shape)
    fits = len(declared) == 4 and all(
        not isinstance(d, int) or d == want for d, want in zip(declared[1:], shape_chw, strict=True)
    )
    if not fits or (isinstance(declared[0], int) and declared[0] != 1):
        raise FilterForwardError(
            f"MC input '{meta.name}' has shape {_dims(declared)}, but tap '{spec.tap}' cropped to the ROI at "
            f"{spec.input_size[0]}x{spec.input_size[1]} needs [batch, {', '.join(map(str, shape_chw))}]; "
            "retrain the MC for this tap, ROI and input size"
        )
    return np.zeros((1, *shape_chw), np.float32)


def _reduced_channels(session: ort.InferenceSession, spec: FilterSpec) -> int:
    """R of a windowed MC: from its `reduced` output, else from its `history` input."""
    reduced = next(o for o in session.get_outputs() if o.name == REDUCED_OUTPUT).shape
    history = next(i for i in session.get_inputs() if i.name == HISTORY_INPUT).shape
    if len(reduced) == 4 and isinstance(reduced[1], int):
        return reduced[1]
    if len(history) == 4 and isinstance(history[1], int) and history[1] % (spec.window - 1) == 0:
        return history[1] // (spec.window - 1)
    raise FilterForwardError(
        f"windowed MC needs a static channel count on '{REDUCED_OUTPUT}' [batch, R, h, w] and "
        f"'{HISTORY_INPUT}' [batch, (W-1)*R, h, w] with W={spec.window}; re-export it"
    )


def _check_dry_run(
    session: ort.InferenceSession, feeds: dict[str, np.ndarray], crop: tuple[int, int, int], spec: FilterSpec
) -> None:
    try:
        outputs = dict(zip([o.name for o in session.get_outputs()], run_with_deadline(session, feeds), strict=True))
    except FilterForwardError:
        raise
    except Exception as exc:  # ONNX Runtime's own exception types
        raise FilterForwardError(f"the MC model fails on a one-frame input: {_first_line(exc)}") from None
    score = outputs[SCORE_OUTPUT]
    if score.shape != (1,):
        raise FilterForwardError(
            f"MC output '{SCORE_OUTPUT}' has shape {list(score.shape)} for one frame; it must be [batch]"
        )
    if not (np.isfinite(score).all() and 0.0 <= float(score[0]) <= 1.0):
        raise FilterForwardError(
            f"MC output '{SCORE_OUTPUT}' is {float(score[0])}; it must be a probability (end with a sigmoid)"
        )
    if REDUCED_OUTPUT in outputs:
        reduced = outputs[REDUCED_OUTPUT].shape
        history = feeds[HISTORY_INPUT].shape
        if reduced[0] != 1 or reduced[2:] != crop[1:] or reduced[1] * (spec.window - 1) != history[1]:
            raise FilterForwardError(
                f"windowed MC output '{REDUCED_OUTPUT}' has shape {list(reduced)}; with history {list(history)} "
                f"and window {spec.window} it must be [1, {history[1] // (spec.window - 1)}, {crop[1]}, {crop[2]}]"
            )


def _dims(shape: list) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"


def _too_big(size: int) -> str:
    return f"the MC model is {size / 2**20:.1f} MiB, over the {MAX_MODEL_BYTES // 2**20} MiB limit; use a smaller MC"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
