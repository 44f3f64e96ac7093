"""Frame and clip payloads on disk: root/{frames,clips}/<edge>/<camera>/<name>, written atomically.

Rows in the database hold the paths relative to the root that `write` returns. Every path that comes
back in (from a row or, through the REST layer, from a client) goes through `_inside`, which refuses
absolute paths, `..` parts and symlinks that lead out of the root, so nothing outside the store is
ever read or deleted.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path, PurePosixPath
from typing import Literal

from common.files import TEMPORARY, safe_name, write_atomically
from models.errors import FilterForwardError, is_disk_full

PayloadKind = Literal["frames", "clips", "fragments"]
KINDS: tuple[PayloadKind, ...] = ("frames", "clips", "fragments")


class DiskFull(FilterForwardError):
    """The frame store's disk has no room for a payload (ENOSPC or a quota): nothing was stored."""


def _shown(relative: str) -> str:
    return repr(relative[:200])  # repr keeps a hostile path on one line


class FrameStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.orphans_scanned_at = -math.inf  # time.monotonic() of the last remove_orphans (a walk of the store)

    def write(
        self, kind: Literal["frames", "clips", "fragments"], edge: str, camera: str, name: str, data: bytes
    ) -> str:
        """Store `data` (replacing a file of the same name atomically); returns its path relative to the root."""
        if kind not in KINDS:
            raise FilterForwardError(f"unknown payload kind {kind!r}: use one of {', '.join(KINDS)}")
        relative = PurePosixPath(kind, safe_name(edge), safe_name(camera), safe_name(name))
        try:
            write_atomically(self.root / relative, data)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DiskFull(
                f"frame store {self.root} is full ({exc.strerror}): could not write {len(data)} bytes to {relative}; "
                "free space there or lower retention.max_bytes / retention.max_age_days"
            ) from None
        return str(relative)

    def open_path(self, relative: str) -> Path:
        """The absolute path of a stored file; FilterForwardError if `relative` leads outside the store or is gone."""
        path = self._inside(relative)
        if not path.is_file():
            raise FilterForwardError(
                f"no stored file at {_shown(relative)}: it was deleted by retention or never stored"
            )
        return path

    def delete(self, relative: str) -> int:
        """Remove a stored file; returns the bytes freed (0 if it was already gone)."""
        path = self._inside(relative)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def total_bytes(self) -> int:
        return sum(
            (Path(folder) / name).stat().st_size
            for folder, _dirs, names in os.walk(self.root)
            for name in names
            if not name.startswith(TEMPORARY)
        )

    def remove_orphans(self, older_than: float) -> tuple[int, int]:
        """Delete the temporary files of writes that never finished (the process was killed mid-write), last
        modified more than `older_than` seconds ago; returns (files, bytes) removed."""
        cutoff, files, freed = time.time() - older_than, 0, 0
        self.orphans_scanned_at = time.monotonic()
        for folder, _dirs, names in os.walk(self.root):
            for name in (n for n in names if n.startswith(TEMPORARY)):
                path = Path(folder) / name
                try:
                    info = path.stat()
                    if info.st_mtime <= cutoff:
                        path.unlink()
                        files, freed = files + 1, freed + info.st_size
                except FileNotFoundError:  # its write finished (renamed) or failed (removed) meanwhile
                    continue
        return files, freed

    def _inside(self, relative: str) -> Path:
        """`relative` resolved under the root, or FilterForwardError if it is not a plain path inside it."""
        pure = PurePosixPath(relative.replace("\\", "/"))
        if not relative or "\x00" in relative or pure.is_absolute() or ".." in pure.parts or ":" in relative:
            raise FilterForwardError(
                f"refused path {_shown(relative)}: use a relative path inside the frame store, without '..'"
            )
        path = (self.root / pure).resolve()
        if not path.is_relative_to(self.root):
            raise FilterForwardError(f"refused path {_shown(relative)}: it leads outside the frame store")
        return path
