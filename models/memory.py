"""Whether a training run fits in memory: what it needs at its peak (the base DNN on a batch of frames, or the
training crops held in memory) against how much this process may still take (what the kernel says is available,
within the limits of the process's cgroup and of its address space, `ulimit -v`). A request that cannot fit is
refused up front, in one line, instead of being killed by the OOM killer (which says nothing) minutes later."""

from __future__ import annotations

import math
import resource
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from models.errors import FilterForwardError
from models.features import FEATURE_BATCH
from models.taps import EFFICIENTNET_LITE0_TAPS, MODEL_STRIDE, PIXEL_TAP, PIXELS, check_input_size, round_input_size

if TYPE_CHECKING:
    from models.datasets.labelled import LabelledDataset
    from models.training import TrainConfig

GIB = 1024**3


def available_memory() -> int | None:
    """Bytes this process may still allocate; None where nothing says (not Linux)."""
    limits = [_meminfo_available(), _cgroup_room(), _address_space_room()]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo: free memory plus the page cache the kernel can drop."""
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_room() -> int | None:
    """The container's limit less its usage (cgroup v2, else v1); None without a limit."""
    for limit_file, usage_file in [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ]:
        limit, usage = _read(limit_file).strip(), _read(usage_file).strip()
        # v1 says "no limit" with a number near 2**63 (rounded to pages), v2 with "max".
        if limit.isdigit() and usage.isdigit() and int(limit) < 2**62:
            return max(0, int(limit) - int(usage))
    return None


def _address_space_room() -> int | None:
    """RLIMIT_AS (`ulimit -v`) less the address space in use; None without a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    fields = _read("/proc/self/statm").split()
    used = int(fields[0]) * resource.getpagesize() if fields else 0
    return max(0, soft - used)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# Peak memory of the base DNN (EfficientNet-Lite0 on ONNX Runtime) per input pixel of each frame of a batch: 105 to
# 200 bytes measured (peak RSS, 768x448 to 3072x1792). The low end: only what surely cannot fit is refused.
BASE_DNN_BYTES_PER_PIXEL = 100
FLOAT32_BYTES = 4  # the training crops are held in memory as float32 (TrainingData.cells_last)


def check_memory(
    dataset: LabelledDataset, configs: list[TrainConfig], copies: int = 1, available: int | None = None
) -> None:
    """Refuse an input size whose base-DNN pass or training crops (of all `configs` at once, `copies` times: one per
    training process) cannot fit in the memory available (available_memory), before the OOM killer ends the run
    without a word. `available`: bytes, instead of what this machine has now."""
    for config in configs:  # a size that is not valid at all is told so first
        try:
            check_input_size(tuple(config.input_size))
        except ValueError as exc:
            raise FilterForwardError(str(exc)) from None
    available = available_memory() if available is None else available
    needed = memory_needed(dataset, configs, copies)
    if available is None or needed <= available:
        return
    width, height = configs[0].input_size
    frames = _context_span(dataset, configs[0])
    largest = _largest_fitting(dataset, configs, copies, available)
    advice = f"use --input-size {largest[0]}x{largest[1]} or smaller" if largest else "train on fewer --frames"
    raise FilterForwardError(
        f"input size {width}x{height} needs about {needed / GIB:.1f} GiB of memory (the base DNN and the features of "
        f"{frames[1] - frames[0]} frames) but {available / GIB:.1f} GiB is available: {advice}"
    )


def check_edge_memory(input_size: tuple[int, int], cameras: int, available: int | None = None) -> None:
    """Refuse an edge whose cameras' base-DNN passes (one per camera at a time, side by side) cannot fit in the
    memory available, before the first frames get the process killed by the OOM killer without a word."""
    width, height = input_size
    needed = width * height * BASE_DNN_BYTES_PER_PIXEL * cameras
    available = available_memory() if available is None else available
    if available is None or needed <= available:
        return
    scale = math.sqrt(available / needed)
    columns, rows = int(width * scale) // MODEL_STRIDE, int(height * scale) // MODEL_STRIDE
    fewer = "run fewer cameras on this edge"
    advice = (
        f"set input_size to {columns * MODEL_STRIDE}x{rows * MODEL_STRIDE} or smaller" if columns and rows else fewer
    )
    if columns and rows and cameras > 1:
        advice += f", or {fewer}"
    raise FilterForwardError(
        f"input_size {width}x{height} needs about {needed / GIB:.1f} GiB of memory for the base DNN of {cameras} "
        f"camera(s) but {available / GIB:.1f} GiB is available: {advice}"
    )


def memory_needed(dataset: LabelledDataset, configs: list[TrainConfig], copies: int = 1) -> int:
    """Bytes at the peak: the base DNN on a batch of frames at the largest input size (its views' included), or the
    float32 crops of every config and view held for training, whichever is more (the first is gone by then)."""
    sizes = [size for config in configs for size, _ in _view_sizes(config)]
    base_dnn = max(width * height for width, height in sizes) * FEATURE_BATCH * BASE_DNN_BYTES_PER_PIXEL
    crops = sum(_crop_bytes(dataset, config) for config in configs) * copies
    return max(base_dnn, crops)


def _view_sizes(config: TrainConfig) -> list[tuple[tuple[int, int], int]]:
    """The input sizes the training crops are computed at, and how many crops of each (mirror: one more)."""
    width, height = config.input_size
    scaled = [round_input_size((width * scale, height * scale)) for scale in config.scales]
    return [(config.input_size, 1 + config.mirror), *((size, 1) for size in scaled)]


def _crop_bytes(dataset: LabelledDataset, config: TrainConfig) -> int:
    """The float32 crops of the config's frames at each of its input sizes; 0 for a tap of unknown geometry (a
    custom base model's: its base-DNN pass is still counted)."""
    tap = PIXEL_TAP if config.tap_name == PIXELS else EFFICIENTNET_LITE0_TAPS.get(config.tap_name)
    if tap is None:
        return 0
    start, stop = _context_span(dataset, config)
    total = 0
    for size, count in _view_sizes(config):
        channels, height, width = tap.shape(size)
        rows, cols = config.roi.cell_shape(max(1, height), max(1, width))
        total += count * channels * rows * cols
    return total * (stop - start) * FLOAT32_BYTES


def _context_span(dataset: LabelledDataset, config: TrainConfig) -> tuple[int, int]:
    """The frames whose crops are loaded: the training range and a windowed MC's W-1 frames before it."""
    start, stop = config.frames or (0, dataset.n_frames)
    return max(0, start - (config.context - 1)), stop


def _largest_fitting(
    dataset: LabelledDataset, configs: list[TrainConfig], copies: int, available: int
) -> tuple[int, int] | None:
    """The largest input size of the same aspect (multiples of the model stride) whose needs fit; None if none."""
    width, height = configs[0].input_size
    for columns in range(width // MODEL_STRIDE - 1, 0, -1):
        size = (columns * MODEL_STRIDE, max(1, round(height * columns / width)) * MODEL_STRIDE)
        if memory_needed(dataset, [replace(c, input_size=size) for c in configs], copies) <= available:
            return size
    return None
