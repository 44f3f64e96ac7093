"""The MC bank: every registered microclassifier, evaluated on the shared taps of each frame.

MCs on the same tap and ROI share their input: the crop is cut once per frame and handed to each of
them. The set of MCs is an immutable snapshot swapped atomically, so filters are added, updated or
removed while frames flow, without a restart and without a frame seeing a half-changed bank.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from edge.basednn import pixels, session_options
from models.bundle import check_mc_model
from models.errors import FilterForwardError
from models.filterspec import FilterSpec
from models.taps import PIXEL_TAP, PIXELS, Tap

log = logging.getLogger(__name__)
# Below this many MCs a frame's scoring is too short to be worth handing to other threads.
PARALLEL_FROM = 4


@dataclass(frozen=True)
class LoadedMC:
    """One filter ready to run: its spec, its ONNX session and where its crop lies on its tap."""

    spec: FilterSpec
    session: ort.InferenceSession
    rows: slice
    cols: slice
    history_shape: tuple[int, ...] | None  # windowed MCs: (1, (W-1)*R, h, w)

    @property
    def crop_key(self) -> tuple[str, int, int, int, int]:
        return self.spec.tap, self.rows.start, self.rows.stop, self.cols.start, self.cols.stop


@dataclass
class CameraState:
    """Per-camera memory of windowed MCs: the reduced features of their last W-1 frames."""

    history: dict[str, np.ndarray] = field(default_factory=dict)


def load_mc(spec: FilterSpec, onnx_bytes: bytes, taps: Mapping[str, Tap], input_size: tuple[int, int]) -> LoadedMC:
    """Check a filter against this node's base DNN and open its ONNX session (single-threaded: MCs are tiny)."""
    if tuple(spec.input_size) != tuple(input_size):
        raise FilterForwardError(
            f"filter {spec.name!r} was trained at input size {spec.input_size[0]}x{spec.input_size[1]} but this edge "
            f"runs {input_size[0]}x{input_size[1]}: retrain it or change the edge's input_size"
        )
    tap = PIXEL_TAP if spec.tap == PIXELS else taps.get(spec.tap)
    if tap is None:
        raise FilterForwardError(
            f"filter {spec.name!r} reads tap {spec.tap!r}, which the base model lacks (it has {sorted(taps)})"
        )
    tap_shape = tap.shape(input_size)
    check_mc_model(spec, onnx_bytes, tap_shape)
    session = ort.InferenceSession(onnx_bytes, session_options(threads=1), providers=["CPUExecutionProvider"])
    rows, cols = spec.roi.cells(tap_shape[1], tap_shape[2])
    history = next((i for i in session.get_inputs() if i.name == "history"), None)
    history_shape = (1, *history.shape[1:]) if history is not None else None
    return LoadedMC(spec, session, rows, cols, history_shape)


class MCBank:
    """Scores every MC that applies to a camera on one frame's taps."""

    def __init__(self, taps: Mapping[str, Tap], input_size: tuple[int, int], workers: int | None = None):
        self.taps = dict(taps)
        self.input_size = input_size
        self._mcs: tuple[LoadedMC, ...] = ()
        self._lock = threading.Lock()  # serialises writers; readers just take the current snapshot
        # MC sessions are single-threaded and ONNX Runtime releases the GIL, so a bank spreads its MCs
        # over the cores that the base DNN has just finished with.
        self.workers = workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.workers - 1, "mc") if self.workers > 1 else None

    @property
    def filters(self) -> dict[str, FilterSpec]:
        return {mc.spec.name: mc.spec for mc in self._mcs}

    def put(self, spec: FilterSpec, onnx_bytes: bytes) -> None:
        """Add a filter, or replace the one with the same name (its windowed history starts afresh)."""
        loaded = load_mc(spec, onnx_bytes, self.taps, self.input_size)
        with self._lock:
            self._mcs = (*(mc for mc in self._mcs if mc.spec.name != spec.name), loaded)
        log.info("filter %s v%d on tap %s is active", spec.name, spec.version, spec.tap)

    def remove(self, name: str) -> bool:
        with self._lock:
            kept = tuple(mc for mc in self._mcs if mc.spec.name != name)
            removed = len(kept) != len(self._mcs)
            self._mcs = kept
        if removed:
            log.info("filter %s removed", name)
        return removed

    def active(self, camera: str) -> tuple[LoadedMC, ...]:
        return tuple(mc for mc in self._mcs if mc.spec.applies_to(camera))

    def needed_taps(self, mcs: Iterable[LoadedMC]) -> set[str]:
        return {mc.spec.tap for mc in mcs if mc.spec.tap != PIXELS}

    def score(
        self, mcs: Iterable[LoadedMC], taps: Mapping[str, np.ndarray], image: np.ndarray, state: CameraState
    ) -> dict[str, float]:
        """Scores of `mcs` (a snapshot from active()) on one frame's taps and its prepared image."""
        mcs = tuple(mcs)
        crops = self._crops(mcs, taps, image)
        if self._pool is None or len(mcs) < PARALLEL_FROM:
            return self._run_all(mcs, crops, state)
        chunks = [mcs[i :: self.workers] for i in range(self.workers)]
        futures = [self._pool.submit(self._run_all, chunk, crops, state) for chunk in chunks[1:]]
        scores = self._run_all(chunks[0], crops, state)  # this thread takes a share too
        for future in futures:
            scores.update(future.result())
        return {mc.spec.name: scores[mc.spec.name] for mc in mcs}

    @staticmethod
    def _crops(mcs: tuple[LoadedMC, ...], taps: Mapping[str, np.ndarray], image: np.ndarray) -> dict:
        """One contiguous crop per (tap, ROI cells), shared by every MC that reads it."""
        sources = dict(taps)
        if any(mc.spec.tap == PIXELS for mc in mcs):
            sources[PIXELS] = pixels(image)  # converted once per frame, whatever the number of ROIs
        crops: dict[tuple[str, int, int, int, int], np.ndarray] = {}
        for mc in mcs:
            if mc.crop_key not in crops:
                crops[mc.crop_key] = np.ascontiguousarray(sources[mc.spec.tap][:1, :, mc.rows, mc.cols])
        return crops

    @classmethod
    def _run_all(cls, mcs: tuple[LoadedMC, ...], crops: dict, state: CameraState) -> dict[str, float]:
        return {mc.spec.name: cls._run(mc, crops[mc.crop_key], state) for mc in mcs}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    @staticmethod
    def _run(mc: LoadedMC, crop: np.ndarray, state: CameraState) -> float:
        if mc.history_shape is None:
            (score,) = mc.session.run(["score"], {"features": crop})
            return float(score.reshape(-1)[0])
        history = state.history.get(mc.spec.name)
        if history is None or history.shape != mc.history_shape:
            history = np.zeros(mc.history_shape, np.float32)
        score, reduced = mc.session.run(["score", "reduced"], {"features": crop, "history": history})
        # Oldest frame out, this frame's reduction in: the ring buffer the next frame sees.
        width = reduced.shape[1]
        state.history[mc.spec.name] = np.concatenate([history[:, width:], reduced], axis=1)
        return float(score.reshape(-1)[0])
