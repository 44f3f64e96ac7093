"""Reduced-precision base DNNs: real int8 calibration on real frames, bf16, their identity, and who refuses what."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edge.mcbank import MCBank
from filterforward.cli import main
from filterforward.commands import models as models_command
from models.base_export import file_digest
from models.base_identity import identify, metadata
from models.base_precision import DEFAULT_CALIBRATION_FRAMES, PRECISIONS, WEIGHTS_KEY, export_precision, int8_weights
from models.base_runtime import RUNTIMES, Choice, choose, openvino_capabilities
from models.basednn import BaseDNN, resize
from models.datasets import open_dataset
from models.errors import FilterForwardError
from models.features import FeatureRequest, cached_features

SIZE = (256, 160)
CALIBRATION_FRAMES = 8  # spread evenly over the car clip; the frames checked below are none of them
TAPS = ("early", "mid", "late")
# Worst tap cosine vs fp32 over the held-out frames, measured at this size and calibration: int8 0.995 (late tap)
# on ONNX Runtime and on OpenVINO on an Intel Xeon with VNNI; 0.979 (mid tap) on an AVX2-only AMD EPYC, whose
# weights keep to 7 bits (models/base_precision.py); bf16 0.995 (mid tap). The bounds leave a margin for other
# CPUs' kernels.
MIN_INT8_COSINE = {"int8": 0.985, "int7": 0.97}
MIN_BF16_COSINE = 0.985
HAS_OPENVINO = openvino_capabilities() is not None


@pytest.fixture(scope="module")
def int8_model(base_model: Path, intel_car: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "int8.onnx"
    return export_precision("int8", out, [intel_car], CALIBRATION_FRAMES, SIZE)


@pytest.fixture(scope="module")
def bf16_model(base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_precision("bf16", tmp_path_factory.mktemp("bf16") / "bf16.onnx")


@pytest.fixture(scope="module")
def held_out(intel_car: Path, shared_data: Path) -> np.ndarray:
    """Frames of the car clip between calibration frames, and of another camera altogether."""
    car = [image for index, image in open_dataset(intel_car).frames(195, 200) if index % 2]
    campus = [image for _, image in open_dataset(shared_data / "tud-campus").frames(10, 13)]
    return np.stack([resize(image, SIZE) for image in car + campus])


def min_cosine(reference: BaseDNN, other: BaseDNN, frames: np.ndarray) -> dict[str, float]:
    """Per tap, the smallest cosine similarity (flattened tap, one frame at a time) over the frames."""
    worst = dict.fromkeys(TAPS, 1.0)
    for frame in frames:
        a, b = reference.run(frame, TAPS), other.run(frame, TAPS)
        for tap in TAPS:
            x, y = a[tap].ravel().astype(np.float64), b[tap].ravel().astype(np.float64)
            worst[tap] = min(worst[tap], float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))))
    return worst


def runtimes() -> list[object]:
    skip = pytest.mark.skipif(not HAS_OPENVINO, reason="OpenVINO is not installed (the [openvino] extra)")
    return ["onnxruntime", pytest.param("openvino", marks=skip)]


def test_int8_export_is_identified_deterministic_and_cached(
    int8_model: Path, base_model: Path, intel_car: Path, tmp_path: Path
) -> None:
    identity = identify(int8_model)
    assert (identity.name, identity.precision) == ("efficientnet_lite0", "int8")
    assert identity.digest != identify(base_model).digest
    props = metadata(int8_model)
    assert props["filterforward.source_digest"] == file_digest(base_model)
    calibration = json.loads(props["filterforward.calibration"])
    assert calibration["frames"] == CALIBRATION_FRAMES and calibration["size"] == list(SIZE)
    assert calibration["sources"] == [intel_car.name]  # a name, not a path: the bytes do not depend on where it lies

    again = export_precision("int8", tmp_path / "again.onnx", [intel_car], CALIBRATION_FRAMES, SIZE)
    assert again.read_bytes() == int8_model.read_bytes()
    stamp = int8_model.stat().st_mtime_ns
    assert export_precision("int8", int8_model, [intel_car], CALIBRATION_FRAMES, SIZE) == int8_model
    assert int8_model.stat().st_mtime_ns == stamp  # the same export is kept, not redone
    other = export_precision("int8", tmp_path / "other.onnx", [intel_car], CALIBRATION_FRAMES + 1, SIZE)
    assert file_digest(other) != file_digest(int8_model)  # other calibration frames, another model


@pytest.mark.parametrize("runtime", runtimes())
def test_int8_taps_are_close_to_fp32_on_held_out_frames(
    int8_model: Path, base_model: Path, held_out: np.ndarray, runtime: str
) -> None:
    int8 = BaseDNN(SIZE, int8_model, threads=2, runtime=runtime)
    assert int8.identity.precision == "int8" and set(TAPS) <= int8.taps.keys()
    worst = min_cosine(BaseDNN(SIZE, base_model, threads=2), int8, held_out)
    assert min(worst.values()) >= MIN_INT8_COSINE[int8_weights()], worst


def test_bf16_is_the_fp32_graph_and_runs_everywhere(bf16_model: Path, base_model: Path, held_out: np.ndarray) -> None:
    assert identify(bf16_model).precision == "bf16"
    assert metadata(bf16_model)["filterforward.source_digest"] == file_digest(base_model)
    fp32 = BaseDNN(SIZE, base_model)
    # Without OpenVINO (or bf16 arithmetic) the same graph runs in fp32: the very features of the fp32 model.
    on_ort = BaseDNN(SIZE, bf16_model, runtime="onnxruntime")
    for tap in TAPS:
        np.testing.assert_array_equal(fp32.run(held_out[0], [tap])[tap], on_ort.run(held_out[0], [tap])[tap])
    if HAS_OPENVINO:
        worst = min_cosine(fp32, BaseDNN(SIZE, bf16_model, threads=2), held_out)
        assert min(worst.values()) >= MIN_BF16_COSINE, worst


@pytest.mark.skipif(not HAS_OPENVINO, reason="OpenVINO is not installed (the [openvino] extra)")
def test_openvino_runs_batches_like_single_frames(int8_model: Path, held_out: np.ndarray) -> None:
    base = BaseDNN(SIZE, int8_model, runtime="openvino")
    batch = base.run(held_out[:3], ["mid"])["mid"]
    single = np.concatenate([base.run(frame, ["mid"])["mid"] for frame in held_out[:3]])
    np.testing.assert_array_equal(batch, single)


def test_runtime_choice_by_precision_and_machine() -> None:
    bf16_cpu, int8_cpu, plain_cpu = frozenset({"FP32", "INT8", "BF16"}), frozenset({"FP32", "INT8"}), frozenset()
    assert choose("fp32", bf16_cpu).runtime == "onnxruntime"  # the fp32 path never depends on the extra
    assert choose("int8", int8_cpu).runtime == "openvino"
    assert choose("int8", None).runtime == choose("int8", plain_cpu).runtime == "onnxruntime"
    assert choose("bf16", bf16_cpu) == choose("bf16", bf16_cpu, "openvino") == Choice("openvino", "bf16")
    # No bf16 arithmetic (x86 without AVX512-BF16/AMX, ARM) or no OpenVINO: fp32 on ONNX Runtime, and said why.
    for capabilities, reason in ((int8_cpu, "no bf16 arithmetic"), (None, "OpenVINO is not installed")):
        choice = choose("bf16", capabilities)
        assert (choice.runtime, choice.arithmetic) == ("onnxruntime", "f32") and reason in choice.shortfall
    assert choose("bf16", int8_cpu, "openvino").arithmetic == "f32"  # asked for: OpenVINO, in fp32
    with pytest.raises(FilterForwardError, match=r"filterforward\[openvino\]"):
        choose("int8", None, "openvino")
    with pytest.raises(FilterForwardError, match="not one of auto, onnxruntime, openvino"):
        choose("int8", int8_cpu, "tensorrt")


def test_mc_bank_refuses_a_filter_trained_on_the_fp32_model(make_filter, int8_model: Path, base_model: Path) -> None:
    spec, onnx_bytes = make_filter("full_frame", "late", SIZE)
    spec = spec.model_copy(update={"base_model": identify(base_model)})
    int8 = BaseDNN(SIZE, int8_model)
    bank = MCBank(int8.taps, int8.input_size, base_model=int8.identity)
    with pytest.raises(FilterForwardError) as refused:
        bank.put(spec, onnx_bytes)
    message = str(refused.value)
    assert "\n" not in message and "fp32" in message and "int8" in message and "retrain" in message
    bank.put(spec.model_copy(update={"base_model": int8.identity}), onnx_bytes)  # trained on it: accepted
    assert list(bank.filters) == [spec.name]


def test_features_are_cached_per_base_model(
    int8_model: Path, base_model: Path, intel_car: Path, feature_cache: Path
) -> None:
    dataset, request = open_dataset(intel_car), FeatureRequest("late")
    fp32 = cached_features(dataset, [request], SIZE, (0, 4), base_model, progress=False)[request]
    int8 = cached_features(dataset, [request], SIZE, (0, 4), int8_model, progress=False)[request]
    assert not np.array_equal(fp32, int8)  # not served the other model's features
    assert np.corrcoef(fp32.ravel(), int8.ravel())[0, 1] > 0.9  # yet the same model's (0.94 with 7-bit weights)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--precision", "fp16"], "precision 'fp16' is not one of fp32, int8, bf16"),
        (["--precision", "int8"], "give --calibration"),
        (["--precision", "int8", "--calibration", "/no/such/clip.mp4"], "/no/such/clip.mp4 does not exist"),
        (["--precision", "int8", "--calibration", "x", "--input-size", "250x160"], "multiples of 32"),
        # int8's options were ignored by the other precisions: an fp32 export the user took for a calibrated one.
        (["--calibration", "clip.mp4"], "--precision fp32 takes no --calibration: drop it or export int8"),
        (
            ["--precision", "bf16", "--calibration-frames", "8", "--input-size", "384x224"],
            "--precision bf16 takes no --calibration-frames, --input-size: drop them or export int8",
        ),
    ],
)
def test_bad_export_requests_are_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    assert main(["models", "export", "--out", str(tmp_path / "x.onnx"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.onnx").exists()


def test_export_to_a_folder_is_refused_before_calibrating(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    args = ["models", "export", "--precision", "int8", "--calibration", "/no/such/clip.mp4", "--out", str(tmp_path)]
    assert main(args) == 2  # the --out check comes first: the missing clip is not reached
    err = capsys.readouterr().err
    assert f"--out {tmp_path} is a folder, not a file: give a file path" in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


def test_an_fp32_export_onto_a_file_that_is_no_model_is_refused(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """It was kept as "the existing export", and the command printed its path as if it had exported."""
    (tmp_path / "y.onnx").write_text("junk\n")
    assert main(["models", "export", "--out", str(tmp_path / "y.onnx")]) == 2
    err = capsys.readouterr().err
    assert "does not load as an ONNX model" in err and "move it away or export to another --out" in err, err
    assert (tmp_path / "y.onnx").read_text() == "junk\n"


def test_cli_lists_what_the_modules_accept() -> None:
    assert all(precision in models_command.PRECISIONS_HELP for precision in PRECISIONS)
    assert models_command.RUNTIMES == RUNTIMES
    assert str(DEFAULT_CALIBRATION_FRAMES) in models_command.DEFAULT_FRAMES_HELP


def test_the_default_fp32_export_is_the_file_the_edge_reads(
    base_model: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import shutil

    from models.base_export import default_base_model_path

    monkeypatch.setenv("FILTERFORWARD_CACHE", str(tmp_path))
    cached = default_base_model_path()  # its folder made by the cache
    shutil.copyfile(base_model, cached)  # an edge's cache that already holds its export
    assert main(["models", "export"]) == 0
    assert capsys.readouterr().out.strip() == str(cached)
    assert sorted(p.name for p in cached.parent.iterdir()) == [cached.name]  # no second, fp32-named file
    assert file_digest(cached) == file_digest(base_model)  # kept, not re-exported: filters record this digest


@pytest.mark.parametrize(
    ("machine", "flags", "expected"),
    [
        ("x86_64", "fpu avx2 avx512f avx512_vnni", "int8"),  # Intel with VNNI (and AMX): no saturation
        ("x86_64", "fpu avx avx2", "int7"),  # AVX2 only: u8 x s8 pairs of 8-bit weights would clip in int16
        ("aarch64", "", "int8"),
        ("x86_64", None, "int7"),  # flags unreadable: the choice that is right on every x86
    ],
)
def test_int8_weights_follow_the_cpus_dot_product(machine: str, flags: str | None, expected: str, tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    if flags is not None:
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert int8_weights(machine, cpuinfo) == expected


def test_the_int8_export_records_its_weight_type(int8_model: Path) -> None:
    weights = metadata(int8_model)[f"filterforward.{WEIGHTS_KEY}"]
    assert weights == int8_weights()
    model = onnx.load(str(int8_model))
    values = [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    low, high = min(int(v.min()) for v in values), max(int(v.max()) for v in values)
    if weights == "int7":  # 7-bit weights: a pair of u8 x s8 products cannot leave int16
        assert low >= -64 and high <= 64
    else:
        assert low < -64 or high > 64  # the full int8 range is used
