"""The MC bank: every registered microclassifier, evaluated on the shared taps of each frame.

MCs that read the same tap (and apply to the same cameras) run fused: their ONNX graphs are merged into
a few ONNX Runtime sessions (edge.mcfusion) that take the whole tap once and slice each ROI inside the
graph, so an added MC costs its arithmetic, not another session run. The set of MCs is an immutable
snapshot, fused graphs included, rebuilt by the caller of put/remove and swapped atomically: filters are
added, updated or removed while frames flow, without a restart and without a frame seeing a half-changed
bank. An MC that cannot be fused runs alone in its own session.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import onnxruntime as ort

from edge.mcfusion import FusedGraph, default_opset, fuse, push_history, window_history
from models.base_runtime import session_options
from models.basednn import pixels
from models.bundle import check_mc_model
from models.errors import FilterForwardError
from models.filterspec import BaseModelId, FilterSpec
from models.mc_kinds import MCWeights
from models.taps import PIXEL_TAP, PIXELS, Tap

log = logging.getLogger(__name__)
_LOADS = itertools.count()  # numbers every load of a filter in this process
# Below this many MCs a frame's scoring is too short to be worth handing to other threads; it is also the
# smallest share of a fused group worth its own graph.
PARALLEL_FROM = 4


@dataclass(frozen=True)
class LoadedMC:
    """One filter ready to run: its spec, its ONNX session and where its crop lies on its tap."""

    spec: FilterSpec
    session: ort.InferenceSession
    rows: slice
    cols: slice
    history_shape: tuple[int, ...] | None  # windowed MCs: (1, (W-1)*R, h, w)
    onnx_bytes: bytes = field(default=b"", repr=False)
    opset: int | None = None
    history_key: str = ""  # unique to this load of the filter: its windowed history in each CameraState
    fused: FusedGraph | None = None  # the graph that runs it with other MCs of its tap, if any
    fusable: bool = True  # False once fusing it failed: it runs alone from then on

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class CameraState:
    """Per-camera memory of windowed MCs: the reduced features of their last W-1 frames, per loaded model (a
    replaced filter's new model starts from zeros, never from the old model's features)."""

    history: dict[str, np.ndarray] = field(default_factory=dict)

    def forget_all_but(self, keys: set[str]) -> None:
        """Drop the histories of models no longer loaded."""
        for key in self.history.keys() - keys:
            del self.history[key]


def load_mc(
    spec: FilterSpec,
    onnx_bytes: bytes,
    taps: Mapping[str, Tap],
    input_size: tuple[int, int],
    base_model: BaseModelId | None = None,
) -> LoadedMC:
    """Check a filter against this node's base DNN and open its ONNX session (single-threaded: MCs are tiny)."""
    check_base_model(spec, base_model)
    check_input_size(spec, input_size)
    tap_shape = tap_shape_of(spec, taps, input_size)
    check_mc_model(spec, onnx_bytes, tap_shape)
    session = ort.InferenceSession(onnx_bytes, session_options(threads=1), providers=["CPUExecutionProvider"])
    rows, cols = spec.roi.cells(tap_shape[1], tap_shape[2])
    history = next((i for i in session.get_inputs() if i.name == "history"), None)
    history_shape = (1, *history.shape[1:]) if history is not None else None
    key = f"{spec.name}#{next(_LOADS)}"
    return LoadedMC(spec, session, rows, cols, history_shape, onnx_bytes, default_opset(onnx_bytes), key)


def check_input_size(spec: FilterSpec, input_size: tuple[int, int]) -> None:
    """Refuse a filter trained at another base-DNN input size: its tap's cells would not be the ones it learned."""
    if tuple(spec.input_size) != tuple(input_size):
        raise FilterForwardError(
            f"filter {spec.name!r} was trained at input size {spec.input_size[0]}x{spec.input_size[1]} but this edge "
            f"runs {input_size[0]}x{input_size[1]}: retrain it or change the edge's input_size"
        )


def check_base_model(spec: FilterSpec, base_model: BaseModelId | None) -> None:
    """Refuse a filter trained on another base model: its scores would mean nothing on this one's features. A
    spec without a recorded base model (older bundles) or a bank without one is not checked."""
    if spec.base_model is None or base_model is None or spec.base_model == base_model:
        return
    raise FilterForwardError(
        f"filter {spec.name!r} was trained on base model {spec.base_model} but this edge runs {base_model}: "
        "retrain it on this edge's base model (filterforward train --base-model) or run the edge on the one it "
        "was trained on"
    )


def tap_shape_of(spec: FilterSpec, taps: Mapping[str, Tap], input_size: tuple[int, int]) -> tuple[int, int, int]:
    """(C, H, W) of the tap a filter reads, or FilterForwardError when the base model lacks it."""
    tap = PIXEL_TAP if spec.tap == PIXELS else taps.get(spec.tap)
    if tap is None:
        raise FilterForwardError(
            f"filter {spec.name!r} reads tap {spec.tap!r}, which the base model lacks (it has {sorted(taps)})"
        )
    return tap.shape(input_size)


class MCBank:
    """Scores every MC that applies to a camera on one frame's taps."""

    def __init__(
        self,
        taps: Mapping[str, Tap],
        input_size: tuple[int, int],
        workers: int | None = None,
        base_model: BaseModelId | None = None,
        weights: MCWeights = "fp32",
    ):
        self.taps = dict(taps)
        self.input_size = input_size
        self.base_model = base_model  # filters trained on another base model are refused
        self.weights = weights  # of the fused graphs' FC layers (edge.mcfusion); an MC that runs alone keeps fp32
        self._mcs: tuple[LoadedMC, ...] = ()
        self._lock = threading.Lock()  # serialises writers; readers just take the current snapshot
        # Sessions are single-threaded and ONNX Runtime releases the GIL, so a bank spreads its fused graphs
        # (and lone MCs) over the cores that the base DNN has just finished with.
        self.workers = workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.workers - 1, "mc") if self.workers > 1 else None

    @property
    def filters(self) -> dict[str, FilterSpec]:
        return {mc.spec.name: mc.spec for mc in self._mcs}

    def put(self, spec: FilterSpec, onnx_bytes: bytes) -> None:
        """Add a filter, or replace the one with the same name (its windowed history starts afresh)."""
        self.put_many([(spec, onnx_bytes)])

    def put_many(self, filters: Sequence[tuple[FilterSpec, bytes]]) -> None:
        """Add or replace several filters with one rebuild of the fused graphs (e.g. at start-up).

        Every filter is checked before any is applied: one bad filter changes nothing."""
        loaded = [
            load_mc(spec, onnx_bytes, self.taps, self.input_size, self.base_model) for spec, onnx_bytes in filters
        ]
        names = {mc.spec.name for mc in loaded}
        with self._lock:
            self._mcs = self._fused((*(mc for mc in self._mcs if mc.spec.name not in names), *loaded))
        for mc in loaded:
            log.info("filter %s v%d on tap %s is active", mc.spec.name, mc.spec.version, mc.spec.tap)

    def remove(self, name: str) -> bool:
        with self._lock:
            kept = tuple(mc for mc in self._mcs if mc.spec.name != name)
            removed = len(kept) != len(self._mcs)
            if removed:
                self._mcs = self._fused(kept)
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
        sources = {name: np.ascontiguousarray(tensor[:1]) for name, tensor in taps.items()}
        if any(mc.spec.tap == PIXELS for mc in mcs):
            sources[PIXELS] = pixels(image)  # converted once per frame, whatever the number of ROIs
        jobs = self._jobs(mcs, sources, state)
        if self._pool is None or len(jobs) < 2 or len(mcs) < PARALLEL_FROM:
            scores = _run_jobs([job for _, job in jobs])
        else:
            shares = _balance(jobs, self.workers)
            futures = [self._pool.submit(_run_jobs, share) for share in shares[1:]]
            scores = _run_jobs(shares[0])  # this thread takes a share too
            for future in futures:
                scores.update(future.result())
        if len(state.history) > sum(mc.history_shape is not None for mc in mcs):
            state.forget_all_but({mc.history_key for mc in mcs})
        return {mc.spec.name: scores[mc.spec.name] for mc in mcs}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    # -- fused graphs ------------------------------------------------------------------------------------

    def _fused(self, mcs: tuple[LoadedMC, ...]) -> tuple[LoadedMC, ...]:
        """`mcs` with their fused graphs: reused where a part's members are unchanged, else built now."""
        built = {_part_key(part): part for part in _parts_of(self._mcs)}
        groups: dict[tuple, list[LoadedMC]] = {}
        for mc in mcs:
            if mc.fusable:
                groups.setdefault(_group_key(mc), []).append(mc)
        fused: dict[str, LoadedMC] = {mc.spec.name: mc for mc in mcs if not mc.fusable}
        for members in groups.values():
            count = min(self.workers, math.ceil(len(members) / PARALLEL_FROM))
            for part in (tuple(members[i::count]) for i in range(count)):
                done = built.get(_part_key(part)) or self._fuse_part(part)
                fused.update((mc.spec.name, mc) for mc in done)
        return tuple(fused[mc.spec.name] for mc in mcs)

    def _fuse_part(self, part: tuple[LoadedMC, ...]) -> tuple[LoadedMC, ...]:
        """The part as one fused graph; when that fails, its halves, down to the MCs that cannot be fused."""
        spec = part[0].spec
        try:
            graph = fuse(spec.tap, tap_shape_of(spec, self.taps, self.input_size), part, self.weights)
        except Exception as exc:  # onnx and ONNX Runtime raise many unrelated types for a graph they reject
            if len(part) == 1:
                log.warning("filter %s cannot be fused with other MCs (%s); it runs alone", spec.name, exc)
                return (replace(part[0], fused=None, fusable=False),)
            half = len(part) // 2
            return self._fuse_part(part[:half]) + self._fuse_part(part[half:])
        return tuple(replace(mc, fused=graph) for mc in part)

    # -- scoring -----------------------------------------------------------------------------------------

    @staticmethod
    def _jobs(
        mcs: tuple[LoadedMC, ...], sources: Mapping[str, np.ndarray], state: CameraState
    ) -> list[tuple[int, Callable[[], dict[str, float]]]]:
        """(cost, work) per fused graph whose members are all wanted, and per MC that runs alone."""
        wanted = {mc.spec.name for mc in mcs}
        graphs = {id(mc.fused): mc.fused for mc in mcs if mc.fused is not None}
        graphs = {key: graph for key, graph in graphs.items() if graph.names <= wanted}
        jobs = [(len(g.members), partial(g.run, sources[g.tap], state.history)) for g in graphs.values()]
        alone = [mc for mc in mcs if mc.fused is None or id(mc.fused) not in graphs]
        jobs += [(1, partial(_run_alone, mc, sources[mc.spec.tap], state)) for mc in alone]
        return jobs


def _group_key(mc: LoadedMC) -> tuple:
    """MCs that can share a graph: same tap, same cameras (a camera runs no other camera's MCs), same opset."""
    cameras = frozenset(mc.spec.cameras)
    return mc.spec.tap, frozenset(["*"]) if "*" in cameras else cameras, mc.opset


def _part_key(part: Iterable[LoadedMC]) -> tuple[int, ...]:
    # A session object is unique to one load of one filter, so it identifies a member across snapshots.
    return tuple(id(mc.session) for mc in part)


def _parts_of(mcs: tuple[LoadedMC, ...]) -> list[tuple[LoadedMC, ...]]:
    """The snapshot's fused graphs, each as its members in graph order."""
    parts: dict[int, list[LoadedMC]] = {}
    for mc in mcs:
        if mc.fused is not None:
            parts.setdefault(id(mc.fused), []).append(mc)
    return [tuple(part) for part in parts.values()]


def _balance(jobs: list[tuple[int, Callable[[], dict[str, float]]]], workers: int) -> list[list[Callable]]:
    """Jobs spread over `workers` shares, largest first onto the least loaded share."""
    shares: list[list[Callable]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for cost, job in sorted(jobs, key=lambda j: -j[0]):
        least = loads.index(min(loads))
        shares[least].append(job)
        loads[least] += cost
    return shares


def _run_jobs(jobs: Iterable[Callable[[], dict[str, float]]]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for job in jobs:
        scores.update(job())
    return scores


def _run_alone(mc: LoadedMC, tap: np.ndarray, state: CameraState) -> dict[str, float]:
    """An MC in its own session (one that could not be fused, or whose graph's other members are not wanted)."""
    crop = np.ascontiguousarray(tap[:, :, mc.rows, mc.cols])
    if mc.history_shape is None:
        (score,) = mc.session.run(["score"], {"features": crop})
        return {mc.spec.name: float(score.reshape(-1)[0])}
    history = window_history(state.history, mc.history_key, mc.history_shape)
    score, reduced = mc.session.run(["score", "reduced"], {"features": crop, "history": history})
    push_history(state.history, mc.history_key, history, reduced)
    return {mc.spec.name: float(score.reshape(-1)[0])}
