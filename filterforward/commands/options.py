"""Parsers for command-line values shared by several subcommands."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from models.errors import FilterForwardError

THREADS_HELP = (
    "torch CPU threads per model (default 1: MCs are tiny; a filter's cross-validation models and its final model "
    "train side by side, as many as the cores allow)"
)

RANGE_HELP = "a negative side counts from the end: --frames=-100: is the last 100 frames"


def parse_size(text: str) -> tuple[int, int]:
    """'768x448' -> (768, 448)."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise FilterForwardError(f"size {text!r} is not WIDTHxHEIGHT, e.g. 768x448") from None
    if width <= 0 or height <= 0:
        raise FilterForwardError(f"size {text!r} must be positive, e.g. 768x448")
    return width, height


def parse_range(text: str, length: int) -> tuple[int, int]:
    """'A:B' (either side optional, B exclusive) -> (A, B) within [0, length], as Python slices them: a negative
    side counts from the end ('-100:' is the last 100 frames), a side past the end stops at it."""
    try:
        start_text, stop_text = text.split(":")
        start = int(start_text) if start_text else None
        stop = int(stop_text) if stop_text else None
    except ValueError:
        raise FilterForwardError(f"frame range {text!r} is not START:STOP, e.g. 0:200, 200: or -100:") from None
    start, stop, _ = slice(start, stop).indices(length)
    if start >= stop:
        raise FilterForwardError(f"frame range {text!r} selects no frames of the {length} available")
    return start, stop


def parse_scales(text: str) -> tuple[float, ...]:
    """'0.75,1.25' -> (0.75, 1.25)."""
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise FilterForwardError(f"scales {text!r} are not comma-separated numbers, e.g. 0.75,1.25") from None


def check_writable(path: Path, option: str, folder: bool) -> None:
    """Fail before any work is done when `path` cannot be written: a folder to write in (`folder`) or a file."""
    kind, other = ("folder", "file") if folder else ("file", "folder")
    if path.exists() and path.is_dir() != folder:
        raise FilterForwardError(f"{option} {path} is a {other}, not a {kind}: give a {kind} path")
    place = path if folder else path.parent  # the folder written in, or the nearest one that exists above it
    existing = next(p for p in (place, *place.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise FilterForwardError(f"{option} {path} cannot be written: {existing} is not a folder you can write in")
    try:  # permissions say nothing to root, nor of read-only mounts and pseudo-filesystems: try it
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError:
        raise FilterForwardError(
            f"{option} {path} cannot be written: {existing} takes no new files: give another path"
        ) from None
