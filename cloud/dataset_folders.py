"""The cloud's datasets on disk: one labelled dataset folder (docs/datasets.md) per dataset under `root/<name>/`.

`images/<number>.jpg` holds frame `number` (zero-padded, so file-name order is number order); `labels.csv` and
`dataset.yaml` are rewritten atomically from the database after every change, so `filterforward train` reads the
folder as it stands. An image folder counts its files as frames, so the CSV only covers the frames before the first
one still missing (footage arriving out of order, or a frame an edge had to drop): a label never lands on the
wrong image.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import yaml

from common.files import write_atomically
from models.datasets.labelled import CAMERA_FRAME, CONFIG_FILE, FRAME_INDEX, LABELS_FILE
from models.errors import FilterForwardError

IMAGES = "images"
DIGITS = 6


def image_name(number: int) -> str:
    return f"{number:0{DIGITS}d}.jpg"


class DatasetFolders:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def folder(self, name: str) -> Path:
        return self.root / name  # names follow NAME_PATTERN (checked by the API): a plain path part

    def image(self, name: str, number: int) -> Path:
        """Where a frame's file is, once it is stored."""
        return self.folder(name) / IMAGES / image_name(number)

    def write_image(self, name: str, number: int, jpeg: bytes) -> None:
        write_atomically(self.folder(name) / IMAGES / image_name(number), jpeg)

    def remove_image(self, name: str, number: int) -> None:
        """An image whose row was not stored after all: the archive would hand it to trainers as a frame."""
        (self.folder(name) / IMAGES / image_name(number)).unlink(missing_ok=True)

    def write_meta(
        self,
        name: str,
        fps: float,
        frames: Mapping[int, int],
        labels: Mapping[str, Mapping[int, int]],
        regions: Mapping[str, list | None],
    ) -> None:
        """labels.csv (frames before the first missing one; `frames`: number -> camera frame index) and
        dataset.yaml (events, their polygons, the frame rate)."""
        usable = contiguous(frames)
        events = sorted(set(labels) | set(regions))
        rows = [",".join([FRAME_INDEX, *events, CAMERA_FRAME])]
        for number in range(usable):
            values = [str(labels.get(event, {}).get(number, -1)) for event in events]
            rows.append(",".join([str(number), *values, str(frames[number])]))
        config: dict = {"name": name, "images": IMAGES, "fps": round(fps, 6) or 1.0, "events": events}
        polygons = {event: polygon for event, polygon in regions.items() if polygon}
        if polygons:
            config["regions"] = polygons
        folder = self.folder(name)
        write_atomically(folder / LABELS_FILE, ("\n".join(rows) + "\n").encode())
        write_atomically(folder / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False).encode())

    def rename(self, old: str, new: str) -> bool:
        """The folder `old` becomes `new`; False when `new` exists (another dataset's: left alone)."""
        try:
            (self.root / old).rename(self.root / new)
        except OSError:
            if not (self.root / new).exists():
                raise
            return False
        return True

    def delete(self, name: str) -> None:
        shutil.rmtree(self.folder(name), ignore_errors=True)

    def archive(self, name: str) -> Iterator[bytes]:
        """The folder (images, labels.csv, dataset.yaml) as an uncompressed tar, in chunks: JPEGs do not compress."""
        folder = self.folder(name)
        if not (folder / LABELS_FILE).is_file():
            raise FilterForwardError(f"dataset {name!r} has no labels.csv yet: label some frames first")
        buffer = _Chunks()
        with tarfile.open(fileobj=buffer, mode="w|") as tar:
            for path in [folder / LABELS_FILE, folder / CONFIG_FILE, *sorted((folder / IMAGES).glob("*.jpg"))]:
                tar.add(path, arcname=str(path.relative_to(folder)))
                yield from buffer.take()
        yield from buffer.take()


def contiguous(frames: Mapping[int, int]) -> int:
    """How many frames are numbered 0, 1, ... without a gap."""
    count = 0
    while count in frames:
        count += 1
    return count


class _Chunks(io.RawIOBase):
    """A write-only stream that keeps what tarfile writes until `take()` hands it on."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> list[bytes]:
        parts, self._parts = self._parts, []
        return parts
