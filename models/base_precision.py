"""Reduced-precision exports of the base DNN: int8 (calibrated on real frames) and bf16. Needs onnxruntime and onnx.

int8 is ONNX Runtime's static QDQ quantization: 8-bit weights per output channel, uint8 activations per tensor
with min/max ranges seen on real frames of the operator's cameras. The weights are int8 where the CPU has an int8
dot product that does not saturate (x86 VNNI or AMX, ARM); on other x86 CPUs the u8 x s8 kernels add pairs of
products in int16 and clip them (ONNX Runtime's documented AVX2 caveat), so there the weights keep to 7 bits
(`int7`: int8 values in -64..64, the quantizer's reduce_range), whose pair sums cannot clip. On an AVX2-only AMD
EPYC that took the mean late-tap cosine vs fp32 from 0.986 to 0.989 at the same speed; uint8 weights (0.994)
fall off ONNX Runtime's fast kernels: 184 ms a frame against 32 (fp32 45), and OpenVINO's 48 against 28.

The stem and the first block stay fp32: their per-tensor activation ranges are so wide that uint8 wipes out
the weak channels, and that error grows through the net (mean tap cosine vs fp32 at 768x448: 0.94 with them in
int8, 0.99 without, for ~10% more time). bf16 is the fp32 graph marked bf16: the runtime does the arithmetic
in bf16 (models/base_runtime.py), so there is nothing to calibrate.

An export is a separate ONNX file whose metadata names the model, its precision, the digest of the fp32 file it
came from and (int8) a key of the calibration frames; the same inputs give the same bytes, and an existing file
with the same metadata is kept, like the fp32 export's cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx

from models.base_export import BASE_MODEL_NAME, default_base_model_path, ensure_base_model, file_digest
from models.base_identity import PRECISION_KEY, identify, metadata, set_identity
from models.basednn import resize
from models.cache import cache_dir, written_whole
from models.datasets.frames import probe, read_frames
from models.datasets.labelled import LABELS_FILE, open_dataset
from models.errors import FilterForwardError
from models.taps import IMAGE_INPUT, check_input_size

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "int8", "bf16")
DEFAULT_CALIBRATION_FRAMES = 64
# Node-name prefixes of the export (models/base_export.py) that int8 keeps in fp32 (see the module docstring).
FP32_PREFIXES = ("/net/stem/", "/net/blocks.0/")
SOURCE_KEY = "source_digest"  # under filterforward.*: the fp32 file an export came from
CALIBRATION_KEY = "calibration"
WEIGHTS_KEY = "int8_weights"  # int8 or int7 (see the module docstring)
# /proc/cpuinfo flags of x86 int8 dot products that accumulate in int32 without saturating.
X86_INT8_DOT = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def default_precision_path(precision: str) -> Path:
    """Where an export goes by default: fp32 is the file the edge and training use when no base_model is set."""
    if precision == "fp32":
        return default_base_model_path()
    return cache_dir("base") / f"{BASE_MODEL_NAME}-{precision}.onnx"


def export_precision(
    precision: str,
    out: Path | None = None,
    calibration: Sequence[Path] = (),
    frames: int = DEFAULT_CALIBRATION_FRAMES,
    input_size: tuple[int, int] = (768, 448),
) -> Path:
    """Export EfficientNet-Lite0 at `precision` to `out` (default: the cache) and return the path.

    int8 calibrates on `frames` frames spread evenly over the `calibration` sources (dataset folders, videos or
    image folders) at the edge's `input_size`.
    """
    check_precision(precision)
    out = Path(out) if out else default_precision_path(precision)
    if precision == "fp32":
        if out.exists():  # an existing export is kept (filters record its digest), anything else refused
            try:
                identify(out)
            except FilterForwardError as exc:
                raise FilterForwardError(f"{exc}: move it away or export to another --out") from None
        return ensure_base_model(out)
    images = calibration_frames(calibration, frames, check_size(input_size)) if precision == "int8" else None
    source = ensure_base_model()
    wanted = {SOURCE_KEY: file_digest(source)}
    if images is not None:
        wanted[CALIBRATION_KEY] = calibration_record(calibration, images)
        wanted[WEIGHTS_KEY] = int8_weights()
    if _is_current(out, precision, wanted):
        log.info("%s is already this %s export", out, precision)
        return out
    model = quantize_int8(source, images, wanted[WEIGHTS_KEY]) if images is not None else onnx.load(str(source))
    set_identity(model, BASE_MODEL_NAME, precision, **wanted)
    out.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(out) as tmp:
        onnx.save(model, str(tmp))
    log.info("wrote %s base model %s", precision, out)
    return out


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise FilterForwardError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def check_size(input_size: tuple[int, int]) -> tuple[int, int]:
    try:
        return check_input_size(tuple(input_size))
    except ValueError as exc:
        raise FilterForwardError(str(exc)) from None


def calibration_frames(sources: Sequence[Path], count: int, input_size: tuple[int, int]) -> np.ndarray:
    """`count` frames (N x H x W x 3, uint8 BGR, resized like the edge does) spread evenly over the sources."""
    if not sources:
        raise FilterForwardError(
            "int8 is calibrated on real frames: give --calibration with a dataset folder, video or image folder "
            "of the cameras the edge will watch"
        )
    if count < 1:
        raise FilterForwardError(f"calibration needs at least 1 frame, not {count}")
    paths = [frame_source(Path(source)) for source in sources]
    shares = [count // len(paths) + (i < count % len(paths)) for i in range(len(paths))]
    spread = [_spread(path, share, input_size) for path, share in zip(paths, shares, strict=True) if share]
    return np.stack([image for images in spread for image in images])


def frame_source(path: Path) -> Path:
    """The video or image folder behind a calibration source."""
    if (path / LABELS_FILE).is_file():
        return open_dataset(path).source
    if path.is_file() or path.is_dir():
        return path
    raise FilterForwardError(
        f"calibration source {path} does not exist: give a dataset folder, a video file or an image folder"
    )


def _spread(source: Path, count: int, input_size: tuple[int, int]) -> Iterator[np.ndarray]:
    total = probe(source, fps=1.0).n_frames  # fps only matters for image folders, and not here
    if total == 0:
        raise FilterForwardError(f"calibration source {source} has no frames")
    wanted = set(np.linspace(0, total - 1, min(count, total)).round().astype(int).tolist())
    for index, frame in read_frames(source, 0, max(wanted) + 1):
        if index in wanted:
            yield resize(frame, input_size)


def calibration_record(sources: Sequence[Path], images: np.ndarray) -> str:
    """What the calibration was, for the metadata: names (not paths, so the bytes do not depend on where the data
    lies), frame count, size and a digest of the frames themselves."""
    digest = hashlib.sha256(images.tobytes()).hexdigest()[:16]
    height, width = images.shape[1:3]
    record = {"sources": [Path(s).name for s in sources], "frames": len(images), "size": [width, height]}
    return json.dumps(record | {"digest": digest}, sort_keys=True)


def int8_weights(machine: str | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The 8-bit weights this CPU runs fast and without saturation: int8, or int7 (int8 at 7 bits) on x86 without
    VNNI/AMX (also where the flags cannot be read)."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i386", "i686"):
        return "int8"
    try:
        flags = {flag for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for flag in line.split()}
    except OSError:
        return "int7"
    return "int8" if flags & X86_INT8_DOT else "int7"


def quantize_int8(source: Path, images: np.ndarray, weights: str) -> onnx.ModelProto:
    """Static QDQ quantization of the fp32 model at `source`, calibrated on `images`, with `weights` (int8 or
    int7) weights."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Frames(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(images[:, None])

        def get_next(self) -> dict[str, np.ndarray] | None:
            image = next(self.batches, None)
            return None if image is None else {IMAGE_INPUT: image}

    log.info("calibrating int8 on %d frames of %dx%d", len(images), images.shape[2], images.shape[1])
    with tempfile.TemporaryDirectory(prefix="ff-int8-") as tmp, _quiet_root_logger():
        prepared, out = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        # The quantizer's recommended first step (shape inference, graph clean-up): without it ONNX Runtime's
        # results on the QDQ graph are wrong (tap cosine 0.6 vs fp32; OpenVINO's on the same file are right).
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(out),
            Frames(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            reduce_range=weights == "int7",
            nodes_to_exclude=fp32_nodes(onnx.load(str(prepared))),
        )
        return onnx.load(str(out))


@contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """ONNX Runtime's quantizer logs a line per adjusted weight scale (dozens) on the root logger: keep its warnings
    only, unless debug logging is on."""
    root = logging.getLogger()
    level = root.level
    if level > logging.DEBUG:
        root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.setLevel(level)


def fp32_nodes(model: onnx.ModelProto) -> list[str]:
    """The convolutions of the first layers and the ReLU6 (Clip) after each: excluding a Conv alone would let the
    quantizer drop its Clip, whose clipping the uint8 range would then no longer do."""
    names = [n.name for n in model.graph.node if n.op_type in ("Conv", "Clip") and n.name.startswith(FP32_PREFIXES)]
    if not names:
        raise FilterForwardError(f"the base model has no nodes under {FP32_PREFIXES}: has base_export.py changed?")
    return names


def _is_current(path: Path, precision: str, wanted: dict[str, str]) -> bool:
    if not path.is_file():
        return False
    try:
        props = metadata(path)
    except Exception:  # an unreadable file is simply replaced
        return False
    expected = {PRECISION_KEY: precision} | {f"filterforward.{k}": v for k, v in wanted.items()}
    return all(props.get(key) == value for key, value in expected.items())
