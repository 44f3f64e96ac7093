"""Where exported models and feature caches live on disk ($FILTERFORWARD_CACHE, else ~/.cache/filterforward), and how
a file there (or a bundle's or dataset's files) is written so that no reader ever picks up half of it."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from models.errors import FilterForwardError


class CacheUnusable(FilterForwardError, OSError):
    """The cache folder cannot be made or written (an OSError still, for callers that do without the cache)."""


def cache_dir(*parts: str) -> Path:
    given = os.environ.get("FILTERFORWARD_CACHE")
    root = Path(given) if given else Path.home() / ".cache" / "filterforward"
    path = root.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = "FILTERFORWARD_CACHE" if given else "the cache folder (set FILTERFORWARD_CACHE to move it)"
        raise CacheUnusable(
            f"cannot make {path} in {where}: {exc.strerror or exc}; point FILTERFORWARD_CACHE at a folder you can "
            "write in"
        ) from None
    return path


@contextmanager
def written_whole(target: Path) -> Iterator[Path]:
    """A temporary path beside `target` to write it at: renamed over `target` when the block ends (atomic, so a reader
    sees the old file or the new one), removed when the block raises. The name is this process's and thread's own, so
    two that write the same target at once (an edge and a trainer exporting the base model at first start) never
    write into one file."""
    temporary = _temporary(target)
    try:
        yield temporary
        temporary.replace(target)
    finally:
        temporary.unlink(missing_ok=True)


def write_whole(folder: Path, files: Mapping[str, bytes]) -> None:
    """Each of `files` (name -> bytes) in `folder`, every one written in full before any replaces its old copy: a
    failure (a full disk) leaves the old files as they were, not a new model beside an old spec or half a labels
    file. The error names the file it failed on."""
    folder.mkdir(parents=True, exist_ok=True)
    temporaries: dict[Path, Path] = {}
    target = folder
    try:
        for name, data in files.items():
            target = folder / name
            temporaries[target] = _temporary(target)
            temporaries[target].write_bytes(data)
        for target, temporary in temporaries.items():
            temporary.replace(target)
    except OSError as exc:  # a write's error names no file, a rename's the temporary one
        raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc
    finally:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)


def _temporary(target: Path) -> Path:
    """This process's and thread's own temporary file beside `target`."""
    return target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
