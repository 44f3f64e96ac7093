"""The shared base DNN on the edge: one ONNX Runtime session per node, run once per frame, several taps out."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

from models.base_export import ensure_base_model
from models.base_identity import identify
from models.errors import FilterForwardError
from models.taps import EFFICIENTNET_LITE0_TAPS, IMAGE_INPUT, MODEL_STRIDE, Tap, check_input_size

log = logging.getLogger(__name__)


def session_options(threads: int | None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    # Idle pool threads would otherwise spin after each run and hold the cores the MC bank needs next.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class BaseDNN:
    """Runs the base model on frames resized to `input_size` and returns its taps (float32, NCHW)."""

    def __init__(self, input_size: tuple[int, int], model_path: Path | None = None, threads: int | None = None):
        try:
            self.input_size = check_input_size(tuple(input_size))
        except ValueError as exc:
            raise FilterForwardError(str(exc)) from None
        self.model_path = ensure_base_model(model_path) if model_path is None else _existing(model_path)
        try:
            self.session = ort.InferenceSession(
                str(self.model_path), session_options(threads), providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # ONNX Runtime raises its own exception types for unreadable models
            raise FilterForwardError(f"base model {self.model_path} does not load in ONNX Runtime: {exc}") from exc
        self.taps = self._read_taps()
        self.identity = identify(self.model_path)  # what filters must have been trained on

    def _read_taps(self) -> dict[str, Tap]:
        inputs = self.session.get_inputs()
        if len(inputs) != 1 or inputs[0].name != IMAGE_INPUT:
            raise FilterForwardError(
                f"base model {self.model_path} must have one input named '{IMAGE_INPUT}' (uint8 NHWC BGR), "
                f"found {[i.name for i in inputs]}"
            )
        known = {name: tap for name, tap in EFFICIENTNET_LITE0_TAPS.items()}
        taps = {}
        probe = self.session.run(None, {IMAGE_INPUT: np.zeros((1, MODEL_STRIDE, MODEL_STRIDE, 3), np.uint8)})
        for meta, value in zip(self.session.get_outputs(), probe, strict=True):
            if value.ndim != 4:
                continue  # e.g. logits: not a spatial tap
            stride = MODEL_STRIDE // value.shape[2]
            taps[meta.name] = known.get(meta.name) or Tap(meta.name, int(value.shape[1]), stride)
        return taps

    def prepare(self, frame_bgr: np.ndarray) -> np.ndarray:
        """Resize a decoded frame to the model's input size (area interpolation when shrinking)."""
        height, width = frame_bgr.shape[:2]
        if (width, height) == self.input_size:
            return frame_bgr
        shrink = width > self.input_size[0]
        return cv2.resize(frame_bgr, self.input_size, interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)

    def run(self, images: np.ndarray, taps: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Taps for a batch (N x H x W x 3) or one prepared frame (H x W x 3), uint8 BGR."""
        batch = images[None] if images.ndim == 3 else images
        names = list(taps) if taps is not None else list(self.taps)
        if not names:
            return {}  # ONNX Runtime would read an empty list as "every output"
        unknown = [name for name in names if name not in self.taps and name != "logits"]
        if unknown:
            raise FilterForwardError(f"base model has no tap {unknown[0]!r}; it has {sorted(self.taps)}")
        outputs = self.session.run(names, {IMAGE_INPUT: np.ascontiguousarray(batch)})
        return dict(zip(names, outputs, strict=True))


def pixels(images: np.ndarray) -> np.ndarray:
    """The discrete baseline's input: prepared frames as float32 NCHW in [0, 1]."""
    batch = images[None] if images.ndim == 3 else images
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0


def _existing(path: Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FilterForwardError(f"base model {path} does not exist: give the path of an ONNX file with named taps")
    return path
