"""One-off export of the base DNN (EfficientNet-Lite0 + taps) to ONNX, cached on disk. Needs torch.

The exported graph takes raw frames (uint8, N x H x W x 3, BGR, as OpenCV decodes them) so the edge does
no float preprocessing in Python: the cast, channel flip and normalisation run inside ONNX Runtime.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from models.cache import cache_dir, written_whole
from models.errors import FilterForwardError
from models.taps import EFFICIENTNET_LITE0_TAPS, IMAGE_INPUT

log = logging.getLogger(__name__)

BASE_MODEL_NAME = "efficientnet_lite0"
OPSET = 17
# EfficientNet-Lite was trained on inputs scaled to [-1, 1].
PIXEL_MEAN = 127.0
PIXEL_STD = 128.0
OUTPUTS = (*EFFICIENTNET_LITE0_TAPS, "logits")


def default_base_model_path() -> Path:
    return cache_dir("base") / f"{BASE_MODEL_NAME}.onnx"


def ensure_base_model(path: Path | None = None) -> Path:
    """Path of the exported base model, exporting it first if it is not cached yet."""
    path = path or default_base_model_path()
    if path.is_file():
        return path
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise FilterForwardError(
            f"base model {path} is missing and torch is not installed to export it: run "
            "`filterforward models export` where the [train] extra is installed and copy the file here"
        ) from exc
    export_base_model(path)
    return path


def base_model_file(path: Path | None) -> Path:
    """The base model's ONNX file: the given one, or the default export (made first if missing)."""
    if path is None:
        return ensure_base_model()
    path = Path(path)
    if path.is_dir():
        raise FilterForwardError(f"base model {path} is a folder: give the path of an ONNX file with named taps")
    if not path.is_file():
        raise FilterForwardError(f"base model {path} does not exist: give the path of an ONNX file with named taps")
    return path


def export_base_model(path: Path, sample_size: tuple[int, int] = (224, 224)) -> Path:
    """Export EfficientNet-Lite0 with its taps; height and width stay dynamic (multiples of 32)."""
    import torch

    from models.efficientnet_lite import load_pretrained

    class FramesToTaps(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = load_pretrained()

        def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
            x = image[..., (2, 1, 0)].permute(0, 3, 1, 2).float()  # BGR -> RGB, NHWC -> NCHW
            out = self.net((x - PIXEL_MEAN) / PIXEL_STD)
            return tuple(out[name] for name in OUTPUTS)

    width, height = sample_size
    sample = torch.zeros(1, height, width, 3, dtype=torch.uint8)
    dynamic = {IMAGE_INPUT: {0: "batch", 1: "height", 2: "width"}}
    dynamic.update({name: {0: "batch"} for name in OUTPUTS})
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("exporting %s with taps %s to %s", BASE_MODEL_NAME, ", ".join(OUTPUTS), path)
    with written_whole(path) as tmp:
        torch.onnx.export(
            FramesToTaps().eval(),
            (sample,),
            str(tmp),
            input_names=[IMAGE_INPUT],
            output_names=list(OUTPUTS),
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
        )
    return path


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
