"""The exported base DNN: real pretrained weights, real ONNX Runtime session, right preprocessing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import skimage.data

from models.base_runtime import Runner, openvino_capabilities
from models.basednn import BaseDNN, pixels
from models.errors import FilterForwardError

REPO = Path(__file__).resolve().parents[1]

# ImageNet class indices: 281-285 are the domestic cats; 967 espresso, 968 cup, 504 coffee mug.
CATS = set(range(281, 286))
COFFEE = {967, 968, 504}


@pytest.fixture(scope="module")
def base224() -> BaseDNN:
    return BaseDNN((224, 224))


def top5(base: BaseDNN, rgb: np.ndarray) -> list[int]:
    frame = base.prepare(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    logits = base.run(frame, ["logits"])["logits"][0]
    return [int(i) for i in np.argsort(-logits)[:5]]


def test_real_photos_get_their_imagenet_class(base224: BaseDNN) -> None:
    assert top5(base224, skimage.data.chelsea())[0] in CATS
    assert top5(base224, skimage.data.coffee())[0] in COFFEE


def test_channel_order_matters(base224: BaseDNN) -> None:
    # Feeding RGB where BGR is expected changes the answer's confidence: the flip is really in the graph.
    rgb = base224.prepare(skimage.data.chelsea())
    bgr = base224.prepare(cv2.cvtColor(skimage.data.chelsea(), cv2.COLOR_RGB2BGR))
    a, b = (base224.run(x, ["logits"])["logits"][0] for x in (rgb, bgr))
    assert not np.allclose(a, b, atol=1e-3)


def test_taps_follow_the_input_size() -> None:
    base = BaseDNN((320, 192))
    out = base.run(np.zeros((2, 192, 320, 3), np.uint8))
    assert out["early"].shape == (2, 24, 48, 80)
    assert out["mid"].shape == (2, 112, 12, 20)
    assert out["late"].shape == (2, 320, 6, 10)
    assert all(v.dtype == np.float32 for v in out.values())


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_run_for_some_taps_runs_only_the_graph_they_need(runtime: str) -> None:
    if runtime == "openvino" and openvino_capabilities() is None:
        pytest.skip("OpenVINO is not installed (the [openvino] extra)")
    base = BaseDNN((320, 192), runtime=runtime)
    frames = np.stack([base.prepare(cv2.cvtColor(skimage.data.chelsea(), cv2.COLOR_RGB2BGR))] * 2)
    full = base.run(frames)
    for taps in (["mid"], ["early", "mid"], ["late"]):
        first = base.run(frames, taps)  # served by the full graph while the pruned one opens in the background
        runner = pruned_runner(base, taps)
        assert runner is not base.runner and sorted(runner.output_names) == sorted(taps)  # pruned, its nodes only
        out = base.run(frames, taps)
        assert list(out) == list(first) == taps
        assert all(np.array_equal(out[tap], full[tap]) and np.array_equal(first[tap], full[tap]) for tap in taps)
        assert base._runner_for(list(reversed(taps))) is runner  # opened once per set of taps
    assert base._runner_for(list(base.runner.output_names)) is base.runner


def test_a_process_that_exits_while_a_pruned_graph_opens_exits_cleanly() -> None:
    """A short `eval` ends while the background thread builds the pruned session: the interpreter waits for it
    instead of finalizing under ONNX Runtime (abort, exit status 134, in 3 of 8 runs of such an eval)."""
    script = (
        "import numpy as np; from models.basednn import BaseDNN; base = BaseDNN((320, 192)); "
        "base.run(np.zeros((192, 320, 3), np.uint8), ['mid']); "
        "import threading; assert not any(t.daemon for t in threading.enumerate() if t.name == 'base-dnn-prune')"
    )
    for _ in range(3):
        result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]


def pruned_runner(base: BaseDNN, taps: list[str], timeout: float = 60.0) -> Runner:
    """The runner for these taps once the background thread has opened it."""
    deadline = time.monotonic() + timeout
    while (runner := base._runner_for(taps)) is base.runner:
        assert time.monotonic() < deadline, f"the graph pruned to {taps} did not open in {timeout} s"
        time.sleep(0.01)
    return runner


def test_pixels_are_normalised_nchw() -> None:
    image = np.full((32, 64, 3), 255, np.uint8)
    assert pixels(image).shape == (1, 3, 32, 64)
    assert pixels(image).max() == 1.0


def test_bad_input_size_is_explained() -> None:
    with pytest.raises(FilterForwardError, match=r"multiples of 32 \(e\.g\. 96x96\)$"):  # as --input-size takes it
        BaseDNN((100, 100))


def test_missing_or_corrupt_model_is_explained(tmp_path: Path) -> None:
    with pytest.raises(FilterForwardError, match="does not exist"):
        BaseDNN((224, 224), tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(FilterForwardError, match="does not load"):
        BaseDNN((224, 224), bad)


def test_unknown_tap_is_explained(base224: BaseDNN) -> None:
    with pytest.raises(FilterForwardError, match="no tap 'conv_pw_6'"):
        base224.run(np.zeros((224, 224, 3), np.uint8), ["conv_pw_6"])
