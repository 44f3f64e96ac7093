"""The MC bank on real taps of a real frame: scores, sharing, windowed state, runtime changes, bad filters."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import onnxruntime as ort
import pytest

from edge.mcbank import CameraState, MCBank
from models.basednn import BaseDNN, pixels
from models.datasets import open_dataset
from models.errors import FilterForwardError
from models.roi import ROI

SIZE = (384, 224)


@pytest.fixture(scope="module")
def base() -> BaseDNN:
    return BaseDNN(SIZE)


@pytest.fixture(scope="module")
def frames(intel_car, base: BaseDNN) -> list[np.ndarray]:
    return [base.prepare(image) for _, image in open_dataset(intel_car).frames(190, 198)]


def score_frame(bank: MCBank, base: BaseDNN, image: np.ndarray, state: CameraState, camera: str = "cam") -> dict:
    mcs = bank.active(camera)
    return bank.score(mcs, base.run(image, bank.needed_taps(mcs)), image, state)


def test_scores_equal_running_each_model_alone(make_filter, base: BaseDNN, frames: list[np.ndarray]) -> None:
    bank = MCBank(base.taps, SIZE)
    roi = ROI(x0=0.25, y0=0.1, x1=0.75, y1=0.9)
    filters = [
        make_filter("full_frame", "late", SIZE, name="ff"),
        make_filter("localized", "mid", SIZE, name="loc", roi=roi),
        make_filter("localized", "mid", SIZE, name="loc2", roi=roi),  # same crop as loc: shared input
        make_filter("discrete", "pixels", SIZE, name="disc", roi=roi),
    ]
    for spec, onnx_bytes in filters:
        bank.put(spec, onnx_bytes)
    scores = score_frame(bank, base, frames[0], CameraState())
    assert set(scores) == {"ff", "loc", "loc2", "disc"}
    taps = base.run(frames[0])
    taps["pixels"] = pixels(frames[0])
    for spec, onnx_bytes in filters:
        rows, cols = spec.roi.cells(*taps[spec.tap].shape[2:])
        alone = ort.InferenceSession(onnx_bytes).run(["score"], {"features": taps[spec.tap][:, :, rows, cols]})[0]
        assert scores[spec.name] == pytest.approx(float(alone[0]), abs=1e-5)
        assert 0.0 < scores[spec.name] < 1.0


def test_windowed_mc_keeps_its_ring_buffer_per_camera(make_filter, base: BaseDNN, frames: list[np.ndarray]) -> None:
    bank = MCBank(base.taps, SIZE)
    spec, onnx_bytes = make_filter("windowed", "mid", SIZE, name="win", window=3)
    bank.put(spec, onnx_bytes)
    one, other = CameraState(), CameraState()
    first = score_frame(bank, base, frames[0], one)["win"]
    (key,) = one.history  # the loaded model's
    assert one.history[key].shape[1] % 2 == 0  # W-1 = 2 reduced frames
    later = [score_frame(bank, base, frame, one)["win"] for frame in frames[1:4]]
    # A camera whose history is empty scores the first frame as the other camera did: state is per camera.
    assert score_frame(bank, base, frames[0], other)["win"] == pytest.approx(first, abs=1e-6)
    # Once the window is full of real frames, the history differs from the zeros of a cold start.
    assert not np.allclose(one.history[key], 0.0)
    assert len(later) == 3


def test_a_replaced_windowed_filter_starts_from_an_empty_history(
    make_filter, base: BaseDNN, frames: list[np.ndarray]
) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("windowed", "mid", SIZE, name="win", window=3))
    state = CameraState()
    for frame in frames[:3]:
        score_frame(bank, base, frame, state)  # the old model's reductions fill the window
    retrained, new_onnx = make_filter("windowed", "mid", SIZE, name="win-retrained", window=3)  # other weights
    new_spec = retrained.model_copy(update={"name": "win"})
    bank.put(new_spec, new_onnx)
    after_replace = score_frame(bank, base, frames[3], state)["win"]
    fresh = MCBank(base.taps, SIZE)
    fresh.put(new_spec, new_onnx)
    cold = score_frame(fresh, base, frames[3], CameraState())["win"]
    assert after_replace == pytest.approx(cold, abs=1e-6)  # no feature of the old model leaked in
    assert len(state.history) == 1  # the old model's history is gone


def test_filters_apply_to_their_cameras_only(make_filter, base: BaseDNN, frames: list[np.ndarray]) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="only-gate", cameras=["gate"]))
    assert score_frame(bank, base, frames[0], CameraState(), camera="lobby") == {}
    assert set(score_frame(bank, base, frames[0], CameraState(), camera="gate")) == {"only-gate"}


def test_filters_change_while_frames_flow(make_filter, base: BaseDNN, frames: list[np.ndarray]) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="steady"))
    extra = make_filter("localized", "mid", SIZE, name="extra")
    seen: list[set[str]] = []
    errors: list[BaseException] = []

    def camera() -> None:
        state = CameraState()
        try:
            for i in range(60):
                seen.append(set(score_frame(bank, base, frames[i % len(frames)], state)))
        except BaseException as exc:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(exc)

    thread = threading.Thread(target=camera)
    thread.start()
    while thread.is_alive():
        bank.put(*extra)
        bank.remove("extra")
    thread.join()
    assert not errors
    assert len(seen) == 60  # no frame lost
    assert all("steady" in names and names <= {"steady", "extra"} for names in seen)
    assert not bank.remove("extra")  # already gone


def test_replacing_a_filter_keeps_one_copy(make_filter, base: BaseDNN) -> None:
    bank = MCBank(base.taps, SIZE)
    bank.put(*make_filter("full_frame", "late", SIZE, name="f", version=1))
    bank.put(*make_filter("full_frame", "late", SIZE, name="f", version=2))
    assert bank.filters["f"].version == 2 and len(bank.filters) == 1


def test_bad_filters_are_refused_with_a_reason(make_filter, base: BaseDNN) -> None:
    bank = MCBank(base.taps, SIZE)
    with pytest.raises(FilterForwardError, match="trained at input size 768x448"):
        bank.put(*make_filter("full_frame", "late", (768, 448), name="big"))
    spec, onnx_bytes = make_filter("full_frame", "late", SIZE, name="x")
    with pytest.raises(FilterForwardError, match="lacks"):
        bank.put(spec.model_copy(update={"tap": "conv_pw_6"}), onnx_bytes)
    _, wrong_shape = make_filter("localized", "mid", SIZE, name="y", roi=ROI(x0=0.5))
    with pytest.raises(FilterForwardError):
        bank.put(make_filter("localized", "mid", SIZE, name="y")[0], wrong_shape)
    with pytest.raises(FilterForwardError):
        bank.put(spec, b"garbage")
    assert bank.filters == {}


def test_a_filter_trained_on_another_base_model_is_refused(make_filter, base: BaseDNN) -> None:
    bank = MCBank(base.taps, SIZE, base_model=base.identity)
    spec, onnx_bytes = make_filter("full_frame", "late", SIZE, name="kept")
    bank.put(spec.model_copy(update={"base_model": base.identity}), onnx_bytes)
    other = base.identity.model_copy(update={"precision": "int8", "digest": "0123456789abcdef"})
    stranger = spec.model_copy(update={"name": "stranger", "base_model": other})
    with pytest.raises(FilterForwardError) as error:
        bank.put(stranger, onnx_bytes)
    message = str(error.value)
    assert "'stranger' was trained on base model efficientnet_lite0 int8 (digest 0123456789abcdef)" in message
    assert f"this edge runs {base.identity}" in message and "\n" not in message
    assert set(bank.filters) == {"kept"}  # nothing changed
    bank.put(spec.model_copy(update={"name": "unrecorded"}), onnx_bytes)  # older bundles carry no base model
    assert set(bank.filters) == {"kept", "unrecorded"}


def test_the_base_model_is_identified_by_its_file(base: BaseDNN) -> None:
    identity = base.identity
    assert (identity.name, identity.precision) == ("efficientnet_lite0", "fp32")
    assert identity.digest == hashlib.sha256(base.model_path.read_bytes()).hexdigest()[:16]
