"""The shared base DNN on the edge: one session per node (ONNX Runtime or OpenVINO), run once per frame, several taps
out."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from pathlib import Path

import cv2
import numpy as np

from models.base_export import base_model_file
from models.base_identity import identify
from models.base_runtime import Runner, open_runner
from models.errors import FilterForwardError
from models.taps import EFFICIENTNET_LITE0_TAPS, Tap, check_input_size

log = logging.getLogger(__name__)


class BaseDNN:
    """Runs the base model on frames resized to `input_size` and returns its taps (float32, NCHW).

    `runtime` is "auto" (by the model's precision and what this machine has, see models/base_runtime.py),
    "onnxruntime" or "openvino".
    """

    def __init__(
        self,
        input_size: tuple[int, int],
        model_path: Path | None = None,
        threads: int | None = None,
        runtime: str = "auto",
    ):
        try:
            self.input_size = check_input_size(tuple(input_size))
        except ValueError as exc:
            raise FilterForwardError(str(exc)) from None
        self.model_path = base_model_file(model_path)
        self.identity = identify(self.model_path)  # what filters must have been trained on
        self.runner = open_runner(self.model_path, self.identity.precision, self.input_size, threads, runtime)
        self.taps = self._read_taps()
        self._options = (threads, runtime)
        self._all_outputs = frozenset(self.runner.output_names)
        self._pruned: dict[frozenset[str], Runner] = {}  # per set of outputs asked for: the graph that computes them
        self._opening: set[frozenset[str]] = set()  # each pruned graph is opened once, off the callers' threads
        self._lock = threading.Lock()

    def _read_taps(self) -> dict[str, Tap]:
        """Every 4-D output is a tap; its stride comes from one run on a blank frame of the input size."""
        width, height = self.input_size
        probe = self.runner.run(self.runner.output_names, np.zeros((1, height, width, 3), np.uint8))
        taps = {}
        for name, value in zip(self.runner.output_names, probe, strict=True):
            if value.ndim != 4:
                continue  # e.g. logits: not a spatial tap
            known = EFFICIENTNET_LITE0_TAPS.get(name)
            taps[name] = known or Tap(name, int(value.shape[1]), height // int(value.shape[2]))
        return taps

    def prepare(self, frame_bgr: np.ndarray) -> np.ndarray:
        return resize(frame_bgr, self.input_size)

    def run(self, images: np.ndarray, taps: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Taps for a batch (N x H x W x 3) or one prepared frame (H x W x 3), uint8 BGR."""
        batch = images[None] if images.ndim == 3 else images
        names = list(taps) if taps is not None else list(self.taps)
        if not names:
            return {}  # ONNX Runtime would read an empty list as "every output"
        unknown = [name for name in names if name not in self.taps and name != "logits"]
        if unknown:
            raise FilterForwardError(f"base model has no tap {unknown[0]!r}; it has {sorted(self.taps)}")
        outputs = self._runner_for(names).run(names, np.ascontiguousarray(batch))
        return dict(zip(names, outputs, strict=True))

    def _runner_for(self, names: list[str]) -> Runner:
        """The graph pruned to these outputs when it skips some, so that filters that all read `mid` do not pay for
        the layers after it. Until a background thread has opened it (0.15-0.45 s at 768x448, several frame
        periods of a live camera), and for good if it cannot be opened, the full graph serves: the same values."""
        wanted = frozenset(names)
        if wanted >= self._all_outputs:
            return self.runner
        pruned = self._pruned.get(wanted)
        if pruned is not None:
            return pruned
        with self._lock:
            if wanted not in self._opening:
                self._opening.add(wanted)
                # Not a daemon: the interpreter waits for it at exit (a fraction of a second) instead of finalizing
                # while ONNX Runtime builds the session (a short `eval` then aborted with exit status 134).
                threading.Thread(target=self._open_pruned, args=(wanted,), name="base-dnn-prune").start()
        return self.runner

    def _open_pruned(self, wanted: frozenset[str]) -> None:
        threads, runtime = self._options
        try:
            self._pruned[wanted] = open_runner(
                self.model_path, self.identity.precision, self.input_size, threads, runtime, sorted(wanted)
            )
        except Exception:  # an optimisation only: the full graph keeps serving these outputs
            log.exception("base model %s: could not prune it to %s", self.model_path.name, ", ".join(sorted(wanted)))


def resize(frame_bgr: np.ndarray, input_size: tuple[int, int]) -> np.ndarray:
    """A decoded frame at the model's input size (area interpolation when shrinking)."""
    height, width = frame_bgr.shape[:2]
    if (width, height) == tuple(input_size):
        return frame_bgr
    shrink = width > input_size[0]
    return cv2.resize(frame_bgr, input_size, interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def pixels(images: np.ndarray) -> np.ndarray:
    """The discrete baseline's input: prepared frames as float32 NCHW in [0, 1]."""
    batch = images[None] if images.ndim == 3 else images
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0
