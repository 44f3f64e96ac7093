"""Where matched frames and events go: the interface, and a local folder sink (frames, clips, events.jsonl)."""

from __future__ import annotations

import errno
import json
import logging
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from common.files import safe_name, write_atomically
from common.fragment import Fragment
from models.errors import FilterForwardError
from models.smoother import Event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MatchedFrame:
    """A frame some filter matched, encoded for the trip upstream."""

    camera: str
    index: int
    timestamp: float
    wall_time: float  # unix time when the edge processed it (a back-dated frame is sent later)
    scores: dict[str, float]  # filter name -> score, for the filters that matched
    events: list[str] = field(default_factory=list)  # ids of the events the frame belongs to
    jpeg: bytes = b""


class Sink(Protocol):
    def frame(self, matched: MatchedFrame) -> None: ...

    def event(self, kind: Literal["start", "end"], event: Event, clip: bytes | None = None) -> None: ...

    def fragment(self, camera: str, fragment: Fragment) -> None: ...

    def close(self) -> None: ...


class FolderSink:
    """frames/<camera>/<run>/<index>.jpg, clips/<run>/<event>.mp4, stream/<camera>/<run>/<gop>-<first index>.h264
    (a fragment's access units: a GOP's files concatenated in name order play as raw H.264) and one JSON line per
    frame, event change or fragment, each with its run. A run is one start of the edge, named by its start time:
    frame indexes and event ids start again with every start (a live camera counts from 0), so without it a restart
    wrote over the frames and clips of the one before."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.run = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"  # sorts by time; two starts a second
        try:
            (self.root / "frames").mkdir(parents=True, exist_ok=True)
            (self.root / "clips").mkdir(exist_ok=True)
            self._log = (self.root / "events.jsonl").open("ab", buffering=0)  # each line one write
        except OSError as exc:
            raise FilterForwardError(
                f"cannot use the sink folder {self.root} ({exc.strerror or exc}): set sink.path to a folder this "
                "user can write"
            ) from None
        self._lock = threading.Lock()  # cameras run in their own threads
        log.info("sink %s: this start's files go in its run folders, %s", self.root, self.run)

    def frame(self, matched: MatchedFrame) -> None:
        record = {k: v for k, v in asdict(matched).items() if k != "jpeg"}
        path = self.root / "frames" / safe_name(matched.camera) / self.run / f"{matched.index:08d}.jpg"
        if matched.jpeg:
            write_atomically(path, matched.jpeg)
        # No JPEG: sent before (another filter's match of the same frame), or clip-only filters.
        record["file"] = str(path.relative_to(self.root)) if path.exists() else None
        self._write({"type": "frame", **record})

    def event(self, kind: Literal["start", "end"], event: Event, clip: bytes | None = None) -> None:
        record = {"type": f"event_{kind}", **asdict(event)}
        if clip:
            path = self.root / "clips" / self.run / f"{safe_name(event.id)}.mp4"
            write_atomically(path, clip)
            record["clip"] = str(path.relative_to(self.root))
        self._write(record)

    def fragment(self, camera: str, fragment: Fragment) -> None:
        header = fragment.header
        name = f"{header.gop:06d}-{header.frames[0].index:08d}.h264"
        path = self.root / "stream" / safe_name(camera) / self.run / name
        write_atomically(path, b"".join(fragment.units))
        frames = [entry.index for entry in header.frames]
        self._write(
            {
                "type": "fragment",
                "camera": camera,
                "gop": header.gop,
                "frames": frames,
                "file": str(path.relative_to(self.root)),
                "crop": header.crop.model_dump() if header.crop else None,  # the part of the frame it shows
            }
        )

    def _write(self, record: dict) -> None:
        line = (json.dumps({**record, "run": self.run}) + "\n").encode()
        with self._lock:
            position = self._log.tell()
            try:
                if self._log.write(line) != len(line):
                    raise OSError(errno.ENOSPC, "short write to events.jsonl")
            except OSError:  # a full disk: no half line may be left for the next one to run into
                self._log.truncate(position)
                raise

    def close(self) -> None:
        with self._lock:
            self._log.close()
