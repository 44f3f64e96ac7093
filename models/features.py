"""The feature cache: run the base DNN once over a dataset's frames and keep the ROI crops MCs train on.

Each (dataset, base model, input size, tap, ROI) has one cache entry: an fp16 array over all frames of the
dataset (`features.npy`, a sparse memory-mapped file, so caching a frame range costs only that range)
and a mask of the frames already computed (`filled.npy`). The key hashes the dataset's frame source
(path, size, modification time) and the base model file, so a changed video or model is never served
stale features. One base-DNN pass fills every entry requested together. One writer at a time: under
torchrun, fill the cache on one rank before the others read it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from models.base_export import base_model_file, file_digest
from models.cache import CacheUnusable, cache_dir, written_whole
from models.datasets.frames import images_digest
from models.datasets.labelled import LabelledDataset
from models.errors import FilterForwardError
from models.progress import progress_bar
from models.roi import FULL_FRAME, ROI
from models.stopping import check_stop
from models.taps import PIXEL_TAP, PIXELS, check_input_size

if TYPE_CHECKING:
    from models.basednn import BaseDNN

log = logging.getLogger(__name__)

FEATURE_BATCH = 8  # frames per base-DNN run while caching
FEATURES_FILE = "features.npy"
FILLED_FILE = "filled.npy"
META_FILE = "meta.json"


@dataclass(frozen=True)
class FeatureRequest:
    """Which crop to cache: a tap (or `pixels`) cut to an ROI; mirrored: of the mirror image of each frame, mirrored
    back so that every cell lies where it lies in the frame (training augmentation: the same scene seen from the
    other side, through a real base-DNN pass)."""

    tap: str
    roi: ROI = FULL_FRAME
    mirrored: bool = False


@dataclass
class _Entry:
    request: FeatureRequest
    path: Path
    frames: tuple[int, int]  # the requested range
    missing: np.ndarray  # frame indices of that range not cached yet


def cached_features(
    dataset: LabelledDataset,
    requests: Sequence[FeatureRequest],
    input_size: tuple[int, int],
    frames: tuple[int, int] | None = None,
    model_path: Path | None = None,
    batch_size: int = FEATURE_BATCH,
    progress: bool = True,
) -> dict[FeatureRequest, np.ndarray]:
    """ROI crops (fp16, [stop - start, C, h, w], read-only memmaps) of frames start..stop-1 per request.

    Frames missing from the cache are computed first, with one base-DNN run per frame for all requests.
    """
    try:
        input_size = check_input_size(tuple(input_size))
    except ValueError as exc:
        raise FilterForwardError(str(exc)) from None
    start, stop = checked_range(dataset, frames)
    needs_model = any(r.tap != PIXELS for r in requests)
    model_digest = file_digest(base_model_file(model_path)) if needs_model else ""
    # Pixel crops do not depend on the base model (it only resizes them), so their key leaves it out.
    entries = [
        _entry(dataset, r, input_size, PIXELS if r.tap == PIXELS else model_digest, start, stop)
        for r in dict.fromkeys(requests)
    ]
    todo = [e for e in entries if e.missing.size]
    if todo:
        try:
            _fill(dataset, todo, input_size, model_path, batch_size, progress)
        except OSError as exc:  # a read-only cache serves hits, but the frames it lacks cannot be added
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise CacheUnusable(
                f"cannot write the feature cache ({exc.filename}: {exc.strerror}); point FILTERFORWARD_CACHE at a "
                "folder you can write in"
            ) from None
    else:
        log.debug("feature cache hit for %s frames %d:%d", dataset.name, start, stop)
    return {e.request: np.load(e.path / FEATURES_FILE, mmap_mode="r")[start:stop] for e in entries}


def cache_key(dataset: LabelledDataset, request: FeatureRequest, input_size: tuple[int, int], model_digest: str) -> str:
    """Hash of everything the cached values depend on."""
    stat = dataset.source.stat()
    identity = {
        "source": str(dataset.source.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "n_frames": dataset.n_frames,
        "model": model_digest,
        "input_size": list(input_size),
        "tap": request.tap,
        "roi": [request.roi.x0, request.roi.y0, request.roi.x1, request.roi.y1],
    }
    if dataset.source.is_dir():  # a folder's own mtime moves only when files come or go, not when one is rewritten
        identity["images"] = images_digest(dataset.source)
    if request.roi.context:  # a wider crop (earlier keys stay valid)
        identity["context"] = request.roi.context
    if request.mirrored:
        identity["mirrored"] = True
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def checked_range(dataset: LabelledDataset, frames: tuple[int, int] | None) -> tuple[int, int]:
    """The [start, stop) range of frames (all of them for None), refused when it leaves the dataset."""
    start, stop = frames if frames is not None else (0, dataset.n_frames)
    if not 0 <= start < stop <= dataset.n_frames:
        raise FilterForwardError(
            f"frame range {start}:{stop} is not inside the {dataset.n_frames} frames of {dataset.name}: "
            f"pick START:STOP with 0 <= START < STOP <= {dataset.n_frames}"
        )
    return start, stop


def _entry(
    dataset: LabelledDataset,
    request: FeatureRequest,
    input_size: tuple[int, int],
    model_digest: str,
    start: int,
    stop: int,
) -> _Entry:
    path = cache_dir("features", cache_key(dataset, request, input_size, model_digest))
    filled = _read_filled(path, dataset.n_frames)
    missing = start + np.flatnonzero(~filled[start:stop])
    return _Entry(request, path, (start, stop), missing)


def _read_filled(path: Path, n_frames: int) -> np.ndarray:
    """The mask of cached frames; all False unless both files are intact."""
    try:
        filled = np.load(path / FILLED_FILE)
        features = np.load(path / FEATURES_FILE, mmap_mode="r")
        if filled.shape == (n_frames,) and features.shape[0] == n_frames and features.dtype == np.float16:
            return filled
    except (OSError, ValueError):
        pass
    log.debug("no usable feature cache in %s: computing its frames", path)
    return np.zeros(n_frames, dtype=bool)


def _fill(
    dataset: LabelledDataset,
    entries: list[_Entry],
    input_size: tuple[int, int],
    model_path: Path | None,
    batch_size: int,
    progress: bool,
) -> None:
    """One pass of the base DNN over the frames any entry misses, writing every entry's crop."""
    from models.basednn import BaseDNN  # onnxruntime + OpenCV: only needed when computing

    base = BaseDNN(input_size, model_path)
    needed = {e.request.tap for e in entries}
    unknown = [tap for tap in sorted(needed - {PIXELS}) if tap not in base.taps]
    if unknown:
        raise FilterForwardError(f"the base model has no tap {unknown[0]!r}; it has {sorted(base.taps)} and {PIXELS!r}")
    arrays = [
        _open_array(e, base.taps.get(e.request.tap, PIXEL_TAP).shape(input_size), dataset.n_frames) for e in entries
    ]
    wanted = np.unique(np.concatenate([e.missing for e in entries]))
    log.info(
        "computing %s features of %d frames of %s at %dx%d",
        ", ".join(sorted(needed)),
        wanted.size,
        dataset.name,
        *input_size,
    )
    sides = {side: sorted({e.request.tap for e in entries if e.request.mirrored == side}) for side in (False, True)}
    done = 0
    with progress_bar(progress, total=wanted.size, desc=f"base DNN on {dataset.name}", unit="frame") as bar:
        for indices, images in _batches(dataset, wanted, base.prepare, batch_size):
            check_stop()
            outputs = {mirrored: _taps(base, images, taps, mirrored) for mirrored, taps in sides.items() if taps}
            for entry, array in zip(entries, arrays, strict=True):
                _store(array, entry.request, outputs[entry.request.mirrored][entry.request.tap], indices)
            done += len(indices)
            bar.update(len(indices))
    if done != wanted.size:
        raise FilterForwardError(f"{dataset.source} decoded only {done} of the {wanted.size} frames needed")
    for entry, array in zip(entries, arrays, strict=True):
        array.flush()
        _mark_filled(entry, dataset.n_frames)


def _open_array(entry: _Entry, tap_shape: tuple[int, int, int], n_frames: int) -> np.memmap:
    """The entry's array, created (empty, sparse) when absent or not of the expected shape."""
    channels, height, width = tap_shape
    shape = (n_frames, channels, *entry.request.roi.cell_shape(height, width))
    path = entry.path / FEATURES_FILE
    try:
        array = np.load(path, mmap_mode="r+")
        if array.shape == shape and array.dtype == np.float16:
            return array
    except (OSError, ValueError):
        pass
    (entry.path / FILLED_FILE).unlink(missing_ok=True)
    entry.missing = np.arange(*entry.frames)  # nothing of a fresh array is cached
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=shape)


def _batches(
    dataset: LabelledDataset, wanted: np.ndarray, prepare: Callable[[np.ndarray], np.ndarray], batch_size: int
) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """Decode frames first..last of `wanted` in order and yield batches of the wanted ones, prepared."""
    wanted_set = set(wanted.tolist())
    indices: list[int] = []
    images: list[np.ndarray] = []
    for index, frame in dataset.frames(int(wanted[0]), int(wanted[-1]) + 1):
        if index not in wanted_set:
            continue
        indices.append(index)
        images.append(prepare(frame))
        if len(indices) == batch_size:
            yield np.array(indices), np.stack(images)
            indices, images = [], []
    if indices:
        yield np.array(indices), np.stack(images)


def _taps(base: BaseDNN, images: np.ndarray, taps: list[str], mirrored: bool) -> dict[str, np.ndarray]:
    """The taps (and pixels) of a batch of prepared frames [N, H, W, 3]; mirrored: of their mirror images, each
    map mirrored back. Input widths are multiples of every tap's stride, so the mirrored cells line up exactly."""
    from models.basednn import pixels

    if mirrored:
        images = images[:, :, ::-1]
    outputs = base.run(images, [tap for tap in taps if tap != PIXELS]) if set(taps) - {PIXELS} else {}
    if PIXELS in taps:
        outputs[PIXELS] = pixels(images)
    return {tap: array[..., ::-1] for tap, array in outputs.items()} if mirrored else outputs


def _store(array: np.memmap, request: FeatureRequest, tap: np.ndarray, indices: np.ndarray) -> None:
    rows, cols = request.roi.cells(*tap.shape[2:])
    _reserve(array, int(indices.min()), int(indices.max()) + 1)
    array[indices] = tap[:, :, rows, cols].astype(np.float16)


def _reserve(array: np.memmap, first: int, stop: int) -> None:
    """Disk space for rows first..stop-1 of the sparse array before they are written: a write into a hole of a
    memory map on a full disk kills the process with SIGBUS, not an error anyone can read."""
    if not hasattr(os, "posix_fallocate"):  # macOS: no way to ask ahead
        return
    offset, row = array.offset, array.strides[0]
    fd = os.open(array.filename, os.O_RDWR)
    try:
        os.posix_fallocate(fd, offset + first * row, (stop - first) * row)
    except OSError as exc:
        raise FilterForwardError(
            f"no room for the feature cache in {Path(array.filename).parent} ({exc.strerror}): free space there or "
            "point FILTERFORWARD_CACHE at a disk with room"
        ) from None
    finally:
        os.close(fd)


def _mark_filled(entry: _Entry, n_frames: int) -> None:
    filled = _read_filled(entry.path, n_frames)
    filled[entry.missing] = True
    with written_whole(entry.path / FILLED_FILE) as tmp, tmp.open("wb") as handle:
        np.save(handle, filled)
    meta = {"tap": entry.request.tap, "roi": entry.request.roi.model_dump(), "frames_cached": int(filled.sum())}
    (entry.path / META_FILE).write_text(json.dumps(meta, indent=2))
