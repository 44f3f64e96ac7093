"""Footage for the cloud's datasets (docs/studio.md): a camera's frames, recorded on request and sent to the cloud
after the matched frames.

The cloud resends a FootageRequest until it hears a FootageStatus. In the link's thread the recorder refuses a
camera this edge does not have (or whose source ended), answers `recording` again to a request it knows (recording
or finished: the ids are kept in <spool>/footage/state.json, so a resent request is recorded once, also across
restarts) and otherwise starts recording.

Camera threads hand every decoded frame to offer() before the change gate (footage is what the camera sees); for a
camera nothing is recorded on that is one dict lookup. A recording keeps one frame every `every` s of stream time
(every frame when 0) from the first frame it sees, until `duration` s have passed or `max_frames` are kept: each one
a JPEG in <spool>/footage/<request>/<number>.jpg, its frame index and stream time a line of frames.jsonl beside it.
A recording cut by a stop or a restart ends (done) with the frames it has.

In the link's thread the recorder is a sender: only while fewer than BACKLOG messages wait in the uplink's spool
(footage never delays a matched frame or an event) it moves at most BATCH recorded frames per pass into the spool,
requests in the order they came, frames by number, and deletes each file once spooled; the spool then delivers it
(acks, resends, stored once by the cloud on (edge, seq)). After the last frame a `done` message says how many there
are, and the request's folder goes. How far a request got is a mark the spool stores in the same transaction as the
message, so a restart, even after kill -9, neither repeats nor loses a frame.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from common.files import write_atomically
from common.protocol import FootageRequest, FootageStatus
from edge.encoder import encode_jpeg
from edge.link import Link
from edge.sources import Frame
from edge.uplink import Uplink
from models.errors import FilterForwardError

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
FRAMES_FILE = "frames.jsonl"
JPEG_QUALITY = 90
BACKLOG = 4  # footage is spooled only while fewer messages than this wait in the spool: matched frames go first
BATCH = 4  # footage messages spooled per pass of the link's thread at most: the link stays responsive
TOLERANCE = 1e-3  # seconds: stream times at a fixed rate are not exact multiples of `every` (index / fps)
KEEP_FOR = 7 * 86400.0  # seconds a sent request's id is remembered, so a late resend is not recorded again ...
KEEP_MAX = 1000  # ... and at most this many of them
Status = Literal["recording", "done", "sent"]  # done: all recorded; sent: all in the spool


@dataclass
class _Recording:
    """One request: its parameters and status (the state file), its frames (frames.jsonl) and how far sending got
    (the spool's mark). Only its camera's thread appends to `frames`; the link's thread reads them."""

    request: FootageRequest
    status: Status
    created: float  # unix time
    finished: float | None = None  # unix time recording ended (done) or the last message was spooled (sent)
    frames: list[tuple[int, float]] = field(default_factory=list)  # (frame index, stream time), by number
    start: float | None = None  # stream time of the first frame seen
    due: float = 0.0  # stream time from which the next frame is kept
    next: int = 0  # the next number to spool; len(frames) is the done message

    @property
    def name(self) -> str:
        return self.request.request

    @property
    def key(self) -> str:
        return f"footage:{self.name}"

    def wants(self, timestamp: float) -> bool | None:
        """Whether to keep a frame at stream time `timestamp`; None once `duration` has passed."""
        if self.start is None:
            self.start = self.due = timestamp
        elapsed = timestamp - self.start
        if elapsed >= self.request.duration - TOLERANCE:
            return None
        if timestamp < self.due - TOLERANCE:
            return False
        every = self.request.every
        if every > 0:  # the next point of the grid start + k * every: a gap in the stream does not shift the grid
            self.due = self.start + (math.floor((elapsed + TOLERANCE) / every) + 1) * every
        return True

    def saved(self) -> dict[str, Any]:
        count = None if self.status == "recording" else len(self.frames)
        return {
            "request": self.request.model_dump(),
            "status": self.status,
            "created": self.created,
            "finished": self.finished,
            "frames": count,
        }


class FootageRecorder:
    """Records footage requests to the spool's folder and spools them for the cloud behind the matched frames
    (see the module doc). Create it before the link starts."""

    def __init__(self, link: Link, uplink: Uplink, folder: Path):
        self.link = link
        self.uplink = uplink
        self.folder = Path(folder)
        self.counts = {"recorded": 0}  # frames recorded since the start
        self._lock = threading.Lock()  # state changes and the state file
        self._requests: dict[str, _Recording] = {}  # every known request, oldest first
        self._unsent: list[_Recording] = []  # those with messages still to spool, in order
        self._active: dict[str, tuple[_Recording, ...]] = {}  # camera -> its recordings (replaced, never changed)
        self._ended: set[str] = set()  # cameras whose source ended: nothing more to record
        self._load()
        link.route(FootageRequest, self._requested)
        link.attach(self)

    # -- camera threads --------------------------------------------------------------------------------------

    def offer(self, camera: str, frame: Frame) -> None:
        """A decoded frame of `camera`: kept when a recording on it wants it. A frame that cannot be written ends the
        recording (logged); it never fails the camera's frame."""
        recordings = self._active.get(camera)
        if not recordings:
            return
        for recording in recordings:
            self._offer(recording, frame)

    def camera_ended(self, camera: str) -> None:
        """`camera` delivers no more frames (its source ended or the node stops): its recordings end here."""
        self._ended.add(camera)
        for recording in self._active.get(camera, ()):
            self._finish(recording, "the camera stopped")

    def _offer(self, recording: _Recording, frame: Frame) -> None:
        keep = recording.wants(frame.timestamp)
        if keep is None:
            self._finish(recording, f"{recording.request.duration:g} s recorded")
        elif keep:
            try:
                self._write(recording, frame)
            except (OSError, FilterForwardError) as exc:
                log.error("footage %s: frame %d cannot be written (%s)", recording.name, frame.index, exc)
                self._finish(recording, "a frame could not be written")
                return
            if len(recording.frames) >= recording.request.max_frames:
                self._finish(recording, f"{recording.request.max_frames} frame(s) recorded")

    def _write(self, recording: _Recording, frame: Frame) -> None:
        """The frame as a JPEG file, then its line in frames.jsonl: a frame counts once its line is there."""
        number, folder = len(recording.frames), self._folder(recording)
        write_atomically(folder / f"{number}.jpg", encode_jpeg(frame.image, JPEG_QUALITY))
        line = json.dumps({"number": number, "frame": frame.index, "timestamp": frame.timestamp})
        with (folder / FRAMES_FILE).open("a", encoding="utf-8") as file:
            file.write(line + "\n")
        recording.frames.append((frame.index, frame.timestamp))
        self.counts["recorded"] += 1
        self.link.wake()

    def _finish(self, recording: _Recording, why: str) -> None:
        with self._lock:
            if recording.status != "recording":
                return
            recording.status, recording.finished = "done", time.time()
            camera = recording.request.camera
            self._active[camera] = tuple(r for r in self._active.get(camera, ()) if r is not recording)
            try:
                self._save()
            except OSError as exc:  # the file still says recording: the next start ends it the same way
                log.warning("footage %s: state not saved (%s)", recording.name, exc)
        log.info(
            "footage %s: %d frame(s) of camera %s recorded (%s)", recording.name, len(recording.frames), camera, why
        )
        self.link.wake()

    # -- from any thread -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """For the edge's stats and /metrics (the uplink counts the frames spooled)."""
        return {
            "footage_recording": sum(len(recordings) for recordings in list(self._active.values())),
            "footage_recorded": self.counts["recorded"],
            "footage_waiting": self.waiting(),
        }

    def waiting(self) -> int:
        """Footage messages still to spool: recorded frames, and the done message of each finished recording."""
        return sum(len(r.frames) - r.next + (r.status == "done") for r in list(self._unsent))

    # -- the link's thread -----------------------------------------------------------------------------------

    def _requested(self, request: FootageRequest, _payload: bytes) -> None:
        """Take a request (once) and say so; refuse one for a camera this edge cannot record."""
        with self._lock:
            known = request.request in self._requests
        refusal = None if known else self._refusal(request.camera)
        if refusal is None and not known:
            refusal = self._start(request)
        state = "recording" if refusal is None else "refused"
        status = FootageStatus(edge=self.link.edge_id, request=request.request, state=state, message=refusal or "")
        self.link.post(status)

    def _refusal(self, camera: str) -> str | None:
        if camera not in self.link.cameras:
            return f"camera {camera} is not on edge {self.link.edge_id}: it has {', '.join(self.link.cameras)}"
        if camera in self._ended:
            return f"camera {camera} on edge {self.link.edge_id} delivers no more frames (its source ended)"
        return None

    def _start(self, request: FootageRequest) -> str | None:
        """Start recording; the refusal's text when the state file cannot be written (the request is not taken)."""
        recording = _Recording(request, "recording", time.time())
        self.uplink.spool.unmark(recording.key)  # a mark left by a forgotten request of that name would skip frames
        with self._lock:
            self._requests[recording.name] = recording
            try:
                self._save()
            except OSError as exc:
                del self._requests[recording.name]
                log.error("footage %s: cannot be recorded: %s", recording.name, exc)
                return f"edge {self.link.edge_id} cannot record: {exc}"
            self._unsent.append(recording)
            self._active[request.camera] = (*self._active.get(request.camera, ()), recording)
        log.info(
            "footage %s: recording camera %s, a frame every %g s for %g s, at most %d",
            recording.name,
            request.camera,
            request.every,
            request.duration,
            request.max_frames,
        )
        return None

    def pump(self, now: float) -> None:
        """Spool what is recorded, a few messages per pass, only while matched frames do not wait."""
        for _ in range(BATCH):
            if not self._unsent or self.uplink.spool.messages >= BACKLOG:
                return
            if not self._send_next():
                return

    def next_due(self) -> float | None:
        return None  # a new frame or an ack wakes the link: there is never a timer to wait for

    def _send_next(self) -> bool:
        """Spool the first message due (frames by number, then the done message); False when none is."""
        for recording in list(self._unsent):
            done = recording.status == "done"  # read before the count: once done, the count is final
            if recording.next < len(recording.frames):
                self._send_frame(recording)
                return True
            if done:
                return self._send_done(recording)
        return False

    def _send_frame(self, recording: _Recording) -> None:
        number = recording.next
        path = self._folder(recording) / f"{number}.jpg"
        frame, timestamp = recording.frames[number]
        try:
            jpeg = path.read_bytes()
        except OSError as exc:
            log.warning("footage %s: frame %d cannot be read (%s); skipped", recording.name, number, exc)
        else:
            request, camera, mark = recording.name, recording.request.camera, (recording.key, number + 1)
            self.uplink.footage(request, camera, number, frame, timestamp, jpeg, mark=mark)
        recording.next = number + 1  # one the spool could not take (a full disk) is lost, as matched frames are
        _remove(path)

    def _send_done(self, recording: _Recording) -> bool:
        count, mark = len(recording.frames), (recording.key, len(recording.frames) + 1)
        camera = recording.request.camera
        stored = self.uplink.footage(recording.name, camera, count, 0, 0.0, b"", done=True, frames=count, mark=mark)
        if not stored:
            return False  # a full disk (the message itself is always valid): tried again on a later pass
        self._sent(recording)
        log.info("footage %s: all %d frame(s) spooled for the cloud", recording.name, count)
        return True

    def _sent(self, recording: _Recording) -> None:
        """Everything of `recording` is in the spool: note it, then forget its files and its mark."""
        with self._lock:
            recording.status, recording.finished, recording.next = "sent", time.time(), len(recording.frames) + 1
            if recording in self._unsent:
                self._unsent.remove(recording)
            try:
                self._save()
            except OSError as exc:  # the mark tells the next start that it was sent
                log.warning("footage %s: state not saved (%s)", recording.name, exc)
        shutil.rmtree(self._folder(recording), ignore_errors=True)
        self.uplink.spool.unmark(recording.key)

    # -- the state file --------------------------------------------------------------------------------------

    def _load(self) -> None:
        """The requests of the last run: a recording cut short ends with what it has; sending resumes at the mark."""
        for recording, count in self._read_state():
            self._requests[recording.name] = recording
            if recording.status == "sent":
                continue
            recording.frames = _read_frames(self._folder(recording), count)
            recording.next = self.uplink.spool.mark(recording.key) or 0
            if recording.status == "recording":
                log.info(
                    "footage %s: the edge stopped while recording camera %s; it ends with the %d frame(s) recorded",
                    recording.name,
                    recording.request.camera,
                    len(recording.frames),
                )
                recording.status, recording.finished = "done", time.time()
            self._unsent.append(recording)
        with self._lock:
            self._forget_old()
            try:
                self._save()
            except OSError as exc:  # a full disk: the file says what it said; saved with the next change
                log.warning("footage state %s not saved: %s", self.folder / STATE_FILE, exc)
        for recording in list(self._unsent):
            if recording.next > len(recording.frames):  # the done message went, the state file had not said so
                self._sent(recording)
            else:
                for number in range(recording.next):  # spooled before a crash, file not yet removed
                    _remove(self._folder(recording) / f"{number}.jpg")
        self._remove_strays()

    def _read_state(self) -> list[tuple[_Recording, int | None]]:
        """The saved requests, each with its frame count once recorded."""
        path = self.folder / STATE_FILE
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))["requests"]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("footage state %s is unreadable (%s): earlier requests are forgotten", path, exc)
            return []
        recordings = []
        for entry in entries:
            try:
                request = FootageRequest.model_validate(entry["request"])
                recording = _Recording(request, entry["status"], entry["created"], entry.get("finished"))
            except (KeyError, TypeError, ValidationError) as exc:
                log.warning("footage state %s: an entry is unreadable (%s); skipped", path, exc)
                continue
            if recording.status not in ("recording", "done", "sent"):
                log.warning("footage state %s: unknown status %r; skipped", path, recording.status)
                continue
            recordings.append((recording, entry.get("frames")))
        return recordings

    def _save(self) -> None:
        """The state file, whole or not at all (the caller holds the lock)."""
        state = {"requests": [recording.saved() for recording in self._requests.values()]}
        write_atomically(self.folder / STATE_FILE, json.dumps(state, indent=1).encode())

    def _forget_old(self) -> None:
        """Forget sent requests after KEEP_FOR, and the oldest beyond KEEP_MAX (the caller holds the lock)."""
        cutoff = time.time() - KEEP_FOR
        sent = [r for r in self._requests.values() if r.status == "sent"]
        excess = len(self._requests) - KEEP_MAX
        for index, recording in enumerate(sent):
            if index < excess or (recording.finished or 0) < cutoff:
                del self._requests[recording.name]

    def _remove_strays(self) -> None:
        """Folders of requests that are sent or forgotten (a crash before their removal)."""
        keep = {recording.name for recording in self._unsent}
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            if path.is_dir() and path.name not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def _folder(self, recording: _Recording) -> Path:
        return self.folder / recording.name  # ID_PATTERN: one safe path part


def _read_frames(folder: Path, count: int | None) -> list[tuple[int, float]]:
    """The recorded frames' (index, stream time) from frames.jsonl, up to the first line a crash cut short."""
    frames: list[tuple[int, float]] = []
    try:
        lines = (folder / FRAMES_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return frames
    for line in lines:
        try:
            entry = json.loads(line)
            if entry["number"] != len(frames):
                break
            frames.append((int(entry["frame"]), float(entry["timestamp"])))
        except (ValueError, KeyError, TypeError):
            break
    return frames if count is None else frames[:count]


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("footage file %s cannot be removed: %s", path, exc)
