"""Reading the frames of a recorded dataset: a video file or a folder of images, in a fixed order (OpenCV).

Frame i is the i-th frame that decodes, counted from 0. Containers often state a wrong frame count,
so a video's frames are counted by decoding them once; the count is kept in the user cache (never
beside the data, which may be read-only), keyed by the file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from models.cache import cache_dir
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".ts", ".wmv", ".flv"})
SHORTFALL = 0.9  # fewer decodable frames than this share of the container's count: a damaged video, not a miscount
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})


@dataclass(frozen=True)
class FrameInfo:
    fps: float
    frame_size: tuple[int, int]  # (width, height)
    n_frames: int


def is_video(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in VIDEO_SUFFIXES


def image_files(folder: Path) -> list[Path]:
    """The images in a folder in frame order: by name, digit runs compared as numbers (2.png before 10.png). Hidden
    files (macOS's ._000001.png beside each image copied from its disks) are no frames."""
    return sorted(
        (p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and p.name[0] != "."),
        key=_natural_key,
    )


def images_digest(folder: Path) -> str:
    """A digest of an image folder's frames as files (names, sizes, modification times): changes when any image is
    added, removed, renamed or rewritten."""
    digest = hashlib.sha256()
    for path in image_files(folder):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def _natural_key(path: Path) -> list[int | str]:
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path.name)]


def probe(source: Path, fps: float | None = None) -> FrameInfo:
    """Frame rate, size and decodable frame count of a video file or image folder.

    `fps` overrides the container's rate for a video and is required for an image folder.
    """
    if source.is_dir():
        return _probe_images(source, fps)
    if not source.is_file():
        raise FilterForwardError(f"{source} does not exist: give a video file or an image folder")
    return _probe_video(source, fps)


def read_frames(source: Path, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (index, BGR uint8 frame) for frames start..stop-1 (stop=None: to the end)."""
    if start < 0 or (stop is not None and stop < start):
        raise FilterForwardError(f"bad frame range {start}..{stop}: need 0 <= start <= stop")
    if source.is_dir():
        return _read_images(image_files(source), start, stop)
    return _read_video(source, start, stop)


def _probe_images(folder: Path, fps: float | None) -> FrameInfo:
    files = image_files(folder)
    if not files:
        raise FilterForwardError(
            f"{folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}): point at the image folder"
        )
    if fps is None or fps <= 0:
        raise FilterForwardError(f"image folder {folder} has no frame rate: set `fps:` in dataset.yaml")
    height, width = _read_image(files[0]).shape[:2]
    return FrameInfo(fps=float(fps), frame_size=(width, height), n_frames=len(files))


def _read_image(path: Path) -> np.ndarray:
    # imdecode of the raw bytes also works for paths that cv2.imread cannot open (non-ASCII names).
    data = np.fromfile(path, dtype=np.uint8)
    image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None  # imdecode asserts on no bytes
    if image is None:
        raise FilterForwardError(f"{path} is not a readable image: replace or remove it")
    return image


def _read_images(files: list[Path], start: int, stop: int | None) -> Iterator[tuple[int, np.ndarray]]:
    """The images of the range, each the size of the folder's first image (the dataset's size, as probed): a range
    whose images all share another size must not pass for the dataset's."""
    first_shape: tuple[int, ...] | None = None
    for index in range(start, len(files) if stop is None else min(stop, len(files))):
        image = _read_image(files[index])
        first_shape = first_shape or (image.shape if index == 0 else _read_image(files[0]).shape)
        if image.shape != first_shape:
            raise FilterForwardError(
                f"{files[index]} is {image.shape[1]}x{image.shape[0]}, unlike {files[0].name} "
                f"({first_shape[1]}x{first_shape[0]}): all images of a dataset must have one size"
            )
        yield index, image


def _open_video(path: Path) -> cv2.VideoCapture:
    # Always the FFmpeg backend, so every machine decodes the same pixels in the same order.
    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    if not capture.isOpened():
        raise FilterForwardError(f"{path} cannot be opened as a video: check that it is a video file FFmpeg reads")
    return capture


def _probe_video(path: Path, fps: float | None) -> FrameInfo:
    capture = _open_video(path)
    try:
        ok, first = capture.read()
        if not ok:
            raise FilterForwardError(f"no frame of {path} decodes: check that it is a video file FFmpeg reads")
        container_fps = capture.get(cv2.CAP_PROP_FPS)
        claimed = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        capture.release()
    rate = fps if fps else container_fps
    if not rate or not np.isfinite(rate) or rate <= 0:
        raise FilterForwardError(f"{path} states no frame rate: set `fps:` in dataset.yaml")
    n_frames = _decoded_count(path)
    if n_frames < SHORTFALL * claimed:  # more than a container's usual miscount: frames after a damaged one are lost
        log.warning(
            "%s: only %d of the %d frames its container states decode: the video is damaged or cut short after frame "
            "%d, and the frames from there are not read; repair or re-export it if they matter",
            path, n_frames, claimed, n_frames - 1,
        )  # fmt: skip
    elif n_frames != claimed:
        log.info("%s: the container says %d frames, %d decode; using %d", path, claimed, n_frames, n_frames)
    height, width = first.shape[:2]
    return FrameInfo(fps=float(rate), frame_size=(width, height), n_frames=n_frames)


def _decoded_count(path: Path) -> int:
    record = _count_record(path)
    if record is not None and record.is_file():
        try:
            return int(json.loads(record.read_text())["n_frames"])
        except (OSError, ValueError, KeyError, TypeError):
            log.debug("damaged frame-count record %s: counting again", record)
    log.info("counting the frames of %s by decoding them once", path)
    capture = _open_video(path)
    try:
        n_frames = 0
        while capture.grab():
            n_frames += 1
    finally:
        capture.release()
    if record is not None:
        try:
            record.write_text(json.dumps({"path": str(path.resolve()), "n_frames": n_frames}))
        except OSError as exc:
            log.debug("could not cache the frame count of %s: %s", path, exc)
    return n_frames


def _count_record(path: Path) -> Path | None:
    """The cache file for this exact version of the video (a changed file gets a new record)."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        folder = cache_dir("frame-counts")
    except OSError as exc:
        log.debug("no writable cache for frame counts, counting every time: %s", exc)
        return None
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _read_video(path: Path, start: int, stop: int | None) -> Iterator[tuple[int, np.ndarray]]:
    capture = _open_video(path)
    try:
        # Decode-and-skip rather than seek: seeking is not frame-exact for every codec.
        for _ in range(start):
            if not capture.grab():
                return
        index = start
        while stop is None or index < stop:
            ok, frame = capture.read()
            if not ok:
                return
            yield index, frame
            index += 1
    finally:
        capture.release()
