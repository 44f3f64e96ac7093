"""Fused MC graphs on real taps of a real frame: same scores as each MC alone, windowed state, rebuilds, fallback."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.mcbank import CameraState, LoadedMC, MCBank
from edge.mcfusion import FC_OPS, fused_model, int8_fc_weights
from models.basednn import BaseDNN, pixels
from models.datasets import open_dataset
from models.filterspec import FilterSpec
from models.mc_kinds import MCWeights
from models.roi import ROI
from models.taps import EFFICIENTNET_LITE0_TAPS

SIZE = (384, 224)
LEFT = ROI(x0=0.0, y0=0.0, x1=0.5, y1=1.0)
MIDDLE = ROI(x0=0.25, y0=0.25, x1=0.75, y1=0.75)
BOTTOM = ROI(x0=0.0, y0=0.5, x1=1.0, y1=1.0)


@pytest.fixture(scope="module")
def base() -> BaseDNN:
    return BaseDNN(SIZE)


@pytest.fixture(scope="module")
def frames(intel_car, base: BaseDNN) -> list[np.ndarray]:
    return [base.prepare(image) for _, image in open_dataset(intel_car).frames(190, 196)]


def ensemble_filter(name: str, roi: ROI) -> tuple[FilterSpec, bytes]:
    """A three-seed full-frame ensemble on `late` (the default filter's graph: members and their median)."""
    import torch

    from models.mc_export import export_mc
    from models.microclassifiers import Ensemble, build_mc

    spec = FilterSpec(name=name, architecture="full_frame", tap="late", input_size=SIZE, roi=roi)
    channels, height, width = EFFICIENTNET_LITE0_TAPS["late"].shape(SIZE)
    crop = (channels, *roi.cell_shape(height, width))
    members = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        members.append(build_mc("full_frame", channels, crop[1:]))
    return spec, export_mc(Ensemble(members), crop)


@pytest.fixture(scope="module")
def fleet(make_filter) -> list[tuple[FilterSpec, bytes]]:
    """All four kinds, several per tap, mixed ROIs (two MCs share a crop)."""
    return [
        make_filter("full_frame", "late", SIZE, name="ff-a"),
        make_filter("full_frame", "late", SIZE, name="ff-b"),
        make_filter("full_frame", "late", SIZE, name="ff-left", roi=LEFT),
        make_filter("localized", "mid", SIZE, name="loc-a", roi=MIDDLE),
        make_filter("localized", "mid", SIZE, name="loc-b", roi=MIDDLE),
        make_filter("localized", "mid", SIZE, name="loc-c", roi=BOTTOM),
        make_filter("localized", "mid", SIZE, name="loc-full"),
        make_filter("windowed", "mid", SIZE, name="win-a", window=3),
        make_filter("windowed", "mid", SIZE, name="win-b", window=4, roi=LEFT),
        make_filter("discrete", "pixels", SIZE, name="disc-a", roi=MIDDLE),
        make_filter("discrete", "pixels", SIZE, name="disc-b"),
    ]


class Alone:
    """Reference: each MC in its own plain ONNX Runtime session, its windowed history kept here."""

    def __init__(self, filters: list[tuple[FilterSpec, bytes]], base: BaseDNN):
        self.base = base
        self.sessions = {spec.name: (spec, ort.InferenceSession(onnx_bytes)) for spec, onnx_bytes in filters}
        self.history: dict[str, np.ndarray] = {}

    def score(self, image: np.ndarray) -> dict[str, float]:
        taps = self.base.run(image)
        taps["pixels"] = pixels(image)
        return {name: self._one(spec, session, taps) for name, (spec, session) in self.sessions.items()}

    def _one(self, spec: FilterSpec, session: ort.InferenceSession, taps: dict) -> float:
        rows, cols = spec.roi.cells(*taps[spec.tap].shape[2:])
        feeds = {"features": taps[spec.tap][:, :, rows, cols]}
        if spec.architecture != "windowed":
            return float(session.run(["score"], feeds)[0][0])
        shape = session.get_inputs()[1].shape
        history = self.history.get(spec.name, np.zeros((1, *shape[1:]), np.float32))
        score, reduced = session.run(["score", "reduced"], {**feeds, "history": history})
        self.history[spec.name] = np.concatenate([history[:, reduced.shape[1] :], reduced], axis=1)
        return float(score[0])


def bank_with(
    base: BaseDNN, filters: list[tuple[FilterSpec, bytes]], workers: int = 2, weights: MCWeights = "fp32"
) -> MCBank:
    bank = MCBank(base.taps, SIZE, workers=workers, weights=weights)
    for spec, onnx_bytes in filters:
        bank.put(spec, onnx_bytes)
    return bank


def score_frame(bank: MCBank, base: BaseDNN, image: np.ndarray, state: CameraState) -> dict[str, float]:
    mcs = bank.active("cam")
    return bank.score(mcs, base.run(image, bank.needed_taps(mcs)), image, state)


def history_of(state: CameraState, bank: MCBank, name: str) -> np.ndarray:
    """A camera's history for the model the bank has loaded for filter `name`."""
    return state.history[next(mc.history_key for mc in bank.active("cam") if mc.name == name)]


def graphs(bank: MCBank) -> dict[str, set[str]]:
    """Each MC's graph partners (the names in its fused graph); absent for MCs that run alone."""
    return {mc.name: set(mc.fused.names) for mc in bank.active("cam") if mc.fused is not None}


@pytest.mark.parametrize("workers", [1, 2])
def test_fused_scores_equal_each_model_alone_over_frames(fleet, base: BaseDNN, frames, workers: int) -> None:
    fleet = [*fleet, ensemble_filter("ens-left", LEFT)]  # the default filter's graph fuses too
    bank = bank_with(base, fleet, workers)
    partners = graphs(bank)
    assert set(partners) == {spec.name for spec, _ in fleet}  # every MC runs fused
    assert len(partners["loc-a"] | partners["win-a"]) > 1  # several MCs share a graph
    assert all(partners[spec.name] <= {s.name for s, _ in fleet if s.tap == spec.tap} for spec, _ in fleet)
    alone, state = Alone(fleet, base), CameraState()
    for image in frames:  # several frames: windowed histories fill up through the fused graphs
        want, got = alone.score(image), score_frame(bank, base, image, state)
        assert got == pytest.approx(want, abs=1e-5)
    for name in ("win-a", "win-b"):
        np.testing.assert_allclose(history_of(state, bank, name), alone.history[name], atol=1e-5)
        assert not np.allclose(alone.history[name], 0.0)
    bank.close()


def test_windowed_history_is_the_same_fused_or_alone(make_filter, base: BaseDNN, frames) -> None:
    """A camera given a subset of a fused graph runs those MCs alone; both paths carry the same history."""
    fused_bank = bank_with(base, [make_filter("windowed", "mid", SIZE, name=n, window=3) for n in ("w1", "w2")])
    fused_state, alone_state = CameraState(), CameraState()
    w1 = [mc for mc in fused_bank.active("cam") if mc.name == "w1"]
    for image in frames:
        taps = base.run(image, {"mid"})
        fused = fused_bank.score(fused_bank.active("cam"), taps, image, fused_state)
        alone = fused_bank.score(w1, taps, image, alone_state)  # w2 not wanted: w1 runs in its own session
        assert alone["w1"] == pytest.approx(fused["w1"], abs=1e-5)
    np.testing.assert_allclose(
        alone_state.history[w1[0].history_key], history_of(fused_state, fused_bank, "w1"), atol=1e-5
    )
    assert set(alone_state.history) == {w1[0].history_key}


def test_adding_and_removing_filters_rebuilds_the_graphs(fleet, make_filter, base: BaseDNN, frames) -> None:
    bank = bank_with(base, fleet[:2])  # ff-a, ff-b on late
    assert graphs(bank)["ff-a"] == {"ff-a", "ff-b"}
    late = next(mc.fused for mc in bank.active("cam") if mc.name == "ff-a")
    bank.put(*fleet[3])  # loc-a on mid: its own graph, late's graph is kept as it was
    assert next(mc.fused for mc in bank.active("cam") if mc.name == "ff-a") is late
    assert graphs(bank)["loc-a"] == {"loc-a"}
    bank.put(*fleet[2])  # ff-left joins late
    assert graphs(bank)["ff-a"] == {"ff-a", "ff-b", "ff-left"}
    assert bank.remove("ff-b")
    assert graphs(bank)["ff-left"] == {"ff-a", "ff-left"}
    assert next(mc.fused for mc in bank.active("cam") if mc.name == "ff-a") is not late
    replaced = make_filter("full_frame", "late", SIZE, name="ff-a", version=2, roi=BOTTOM)
    bank.put(*replaced)  # same name, new model: the graph runs the new one
    kept = [fleet[2], fleet[3], replaced]
    assert score_frame(bank, base, frames[0], CameraState()) == pytest.approx(Alone(kept, base).score(frames[0]))
    assert bank.remove("ff-a") and bank.remove("ff-left") and bank.remove("loc-a")
    assert bank.active("cam") == () and score_frame(bank, base, frames[0], CameraState()) == {}


def test_graphs_follow_the_cameras_a_filter_applies_to(make_filter, base: BaseDNN, frames) -> None:
    bank = bank_with(
        base,
        [
            make_filter("full_frame", "late", SIZE, name="everywhere"),
            make_filter("full_frame", "late", SIZE, name="gate-only", cameras=["gate"]),
        ],
    )
    assert {mc.name for mc in bank.active("lobby")} == {"everywhere"}
    fused = {mc.name: mc.fused for mc in bank.active("gate")}
    assert fused["everywhere"] is not fused["gate-only"]  # a lobby frame never computes the gate's MC
    taps = base.run(frames[0], {"late"})
    lobby = bank.score(bank.active("lobby"), taps, frames[0], CameraState())
    gate = bank.score(bank.active("gate"), taps, frames[0], CameraState())
    assert set(lobby) == {"everywhere"} and set(gate) == {"everywhere", "gate-only"}
    assert lobby["everywhere"] == gate["everywhere"]


def stale_type_model(onnx_bytes: bytes) -> bytes:
    """A valid MC whose graph carries a stale value_info (features declared double): fine alone, not fusable."""
    model = onnx.load_model_from_string(onnx_bytes)
    model.graph.value_info.append(helper.make_tensor_value_info("features", TensorProto.DOUBLE, None))
    return model.SerializeToString()


def test_a_model_that_cannot_be_fused_runs_alone(fleet, base: BaseDNN, frames, caplog) -> None:
    spec, onnx_bytes = fleet[3]
    odd = (spec.model_copy(update={"name": "odd"}), stale_type_model(onnx_bytes))
    with caplog.at_level(logging.WARNING, logger="edge.mcbank"):
        bank = bank_with(base, [fleet[4], odd, fleet[5]])
        bank.put(*fleet[6])  # a rebuild does not try (and warn about) the odd one again
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["filter odd cannot be fused with other MCs"]
    mcs: dict[str, LoadedMC] = {mc.name: mc for mc in bank.active("cam")}
    assert mcs["odd"].fused is None and not mcs["odd"].fusable
    assert graphs(bank)["loc-b"] == {"loc-b", "loc-c", "loc-full"}
    scores = score_frame(bank, base, frames[0], CameraState())
    want = Alone([fleet[4], odd, fleet[5], fleet[6]], base).score(frames[0])
    assert scores == pytest.approx(want, abs=1e-5)


def has_fc_layers(onnx_bytes: bytes) -> bool:
    return any(node.op_type in FC_OPS for node in onnx.load_model_from_string(onnx_bytes).graph.node)


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(numpy_helper.to_array(tensor).nbytes for tensor in model.graph.initializer)


def test_int8_weights_quarter_the_fc_bytes_and_keep_the_scores(fleet, base: BaseDNN, frames) -> None:
    """The edge's `mc_weights: int8`: FC layers (localized, windowed, discrete heads) read int8 weights and score
    within 5e-3 of fp32; MCs without FC layers (full-frame, the default filter) score exactly as before."""
    fleet = [*fleet, ensemble_filter("ens-left", LEFT)]
    with_fc = {spec.name for spec, onnx_bytes in fleet if has_fc_layers(onnx_bytes)}
    assert {"loc-a", "win-a", "disc-a"} <= with_fc and "ff-a" not in with_fc and "ens-left" not in with_fc
    bank = bank_with(base, fleet, weights="int8")
    mid = [mc for mc in bank.active("cam") if mc.spec.tap == "mid"]
    fp32 = fused_model(base.taps["mid"].shape(SIZE), mid)
    assert weight_bytes(int8_fc_weights(fp32)) < weight_bytes(fp32) / 3
    alone, state, moved = Alone(fleet, base), CameraState(), 0.0
    for image in frames:
        want, got = alone.score(image), score_frame(bank, base, image, state)
        for name, score in got.items():
            assert score == pytest.approx(want[name], abs=5e-3 if name in with_fc else 1e-5), name
        moved = max(moved, *(abs(got[name] - want[name]) for name in with_fc))
    assert moved > 1e-6  # the int8 weights were used
    bank.close()
