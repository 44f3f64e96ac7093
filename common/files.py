"""Files the edge and the cloud write where a crash or a full disk must not leave half a file behind."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

TEMPORARY = ".tmp-"  # prefix of a file being written; renamed to its name when complete
MAX_NAME = 100  # characters per path part; ids are at most 64, event-derived names stay well below


def _umask() -> int:
    mask = os.umask(0)  # reading it means setting it: done once, at import, before any thread writes files
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's 0600 hid reports and frames from other users


def safe_name(text: str) -> str:
    """One path part made of [A-Za-z0-9_.-] only that is never '', '.' or '..' (nor a hidden file):
    ids from the wire (event ids hold '/') cannot lead outside their folder."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:MAX_NAME]
    if not cleaned or cleaned.startswith("."):
        cleaned = "_" + cleaned[1:]
    return cleaned


def write_atomically(target: Path, data: bytes) -> None:
    """`data` at `target` whole or not at all, on disk before this returns (a reader, or a sender that forgets
    its copy once this is done, never sees a cut-off file); a failure leaves no temporary file behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=TEMPORARY)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
