"""The uplink: the Sink that sends matched frames, events and stream fragments to the cloud over the link,
losing none.

Camera threads call frame()/event()/fragment(), which only append the encoded message to the durable spool
(edge.spool) and wake the link (edge.link); the footage recorder (edge.footage) calls footage() the same way.
In the link's thread the uplink is a sender (the ZeroMQ guide's reliable-delivery pattern, with credit-based flow
control): it sends spooled messages in seq order, at most `window` unacknowledged at a time, and forgets them when
the cloud's Ack lists their seqs; it resends every unacknowledged one when the link resets (a reconnect, the cloud
back or restarted) and any single one unacknowledged for 3 x heartbeat + 1 s. A message that cannot go now (no
connection) just stays spooled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Literal

from pydantic import ValidationError

from common.fragment import Fragment, pack
from common.protocol import (
    Ack,
    Error,
    EventHeader,
    EventInfo,
    FootageHeader,
    FragmentHeader,
    FrameHeader,
    ProtocolError,
    decode,
    encode,
)
from edge.config import SpoolConfig
from edge.link import Link
from edge.sink import MatchedFrame
from edge.spool import Frames, Mark, Spool
from models.errors import validation_summary
from models.smoother import Event

log = logging.getLogger(__name__)


class Uplink:
    """Sink to the cloud: spools every frame/event message and delivers it at least once (see module doc).

    Close the link before the uplink: the link's thread reads the spool."""

    def __init__(self, link: Link, spool: SpoolConfig):
        self.link = link
        self.spool = Spool(spool.path, spool.max_bytes)
        self.counts = {
            "sent_messages": 0, "sent_bytes": 0, "acked": 0, "refused": 0, "unsendable": 0, "footage_spooled": 0,
        }  # fmt: skip
        self.resend_after = 3 * link.config.heartbeat + 1.0
        self._cursor = 0  # highest seq sent in this pass over the spool
        self._in_flight: dict[int, float] = {}  # seq -> when last sent (monotonic)
        self._drained = threading.Condition()
        link.route(Ack, self._acked)
        link.route(Error, self._refused)
        link.on_reset(self._resend_all)
        link.attach(self)

    # -- the Sink, called from camera threads ----------------------------------------------------------

    def frame(self, matched: MatchedFrame) -> None:
        def build(seq: int) -> Frames:
            header = FrameHeader(
                edge=self.link.edge_id,
                run=self.link.run,
                seq=seq,
                camera=matched.camera,
                frame=matched.index,
                timestamp=matched.timestamp,
                wall_time=matched.wall_time,
                scores=matched.scores,
                events=matched.events,
                payload="jpeg" if matched.jpeg else "none",
            )
            return encode(header, matched.jpeg)

        self._spool(build, f"frame {matched.index} of camera {matched.camera}")

    def event(self, kind: Literal["start", "end"], event: Event, clip: bytes | None = None) -> None:
        def build(seq: int) -> Frames:
            header = EventHeader(
                edge=self.link.edge_id,
                run=self.link.run,
                seq=seq,
                phase=kind,
                wall_time=time.time(),
                event=EventInfo(**asdict(event)),
                payload="mp4" if clip else "none",
            )
            return encode(header, clip or b"")

        self._spool(build, f"event {kind} {event.id}", keep=True)

    def fragment(self, camera: str, fragment: Fragment) -> None:
        def build(seq: int) -> Frames:
            header = FragmentHeader(
                edge=self.link.edge_id, run=self.link.run, seq=seq, camera=camera, wall_time=time.time()
            )
            return encode(header, pack(fragment))

        first = fragment.header.frames[0].index
        self._spool(build, f"stream fragment from frame {first} of camera {camera}")

    def footage(
        self,
        request: str,
        camera: str,
        number: int,
        frame: int,
        timestamp: float,
        jpeg: bytes,
        done: bool = False,
        frames: int | None = None,
        mark: Mark | None = None,
    ) -> bool:
        """Spool one frame of a footage request (or, `done`, its last message saying how many `frames` there are),
        with the recorder's `mark` in the same transaction; False when it could not be spooled."""

        def build(seq: int) -> Frames:
            header = FootageHeader(
                edge=self.link.edge_id,
                run=self.link.run,
                seq=seq,
                request=request,
                camera=camera,
                number=number,
                frame=frame,
                timestamp=timestamp,
                done=done,
                frames=frames,
                payload="jpeg" if jpeg else "none",
            )
            return encode(header, jpeg)

        what = f"the end of footage {request}" if done else f"footage {request} frame {number}"
        stored = self._spool(build, what, mark, keep=True)
        if stored and not done:
            self.counts["footage_spooled"] += 1
        return stored

    def close(self) -> None:
        """Close the spool; unacknowledged messages stay in it for next time."""
        self.spool.close()

    # -- from any thread -------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "connected": self.link.connected,
            "spool_messages": self.spool.messages,
            "spool_bytes": self.spool.bytes,
            "spool_dropped": self.spool.dropped,
            "in_flight": self.in_flight,
            "sent_messages": self.counts["sent_messages"],
            "sent_bytes": self.counts["sent_bytes"],
            "acked": self.counts["acked"],
            "refused": self.counts["refused"],
            "refusals": self.link.refused,
            "spool_first_seq": self.spool.first_seq,
            "footage_spooled": self.counts["footage_spooled"],
        }

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def wait_drained(self, timeout: float) -> bool:
        """Wait until the cloud has acknowledged everything spooled; False if `timeout` seconds passed first."""
        with self._drained:
            return self._drained.wait_for(lambda: self.spool.messages == 0, timeout)

    def _spool(self, build: Callable[[int], Frames], what: str, mark: Mark | None = None, keep: bool = False) -> bool:
        def checked(seq: int) -> Frames:
            frames = build(seq)
            decode(frames)  # the cloud must be able to read it: a message it refuses would be resent for ever
            return frames

        try:
            seq = self.spool.append(checked, mark, keep)
        except (ProtocolError, ValidationError) as exc:
            self.counts["unsendable"] += 1
            why = validation_summary(exc) if isinstance(exc, ValidationError) else exc
            log.error("%s cannot be sent (%s); dropped", what, why)
            return False
        self.link.wake()
        return seq is not None

    # -- the link's thread -----------------------------------------------------------------------------

    def pump(self, now: float) -> None:
        """Resend what timed out, then send new messages as the window allows."""
        self._resend_expired(now)
        self._send_new(now)

    def next_due(self) -> float | None:
        return min(self._in_flight.values()) + self.resend_after if self._in_flight else None

    def _acked(self, ack: Ack, _payload: bytes) -> None:
        for seq in ack.seqs:
            self._in_flight.pop(seq, None)
        self.counts["acked"] += self.spool.ack(ack.seqs)
        with self._drained:
            self._drained.notify_all()

    def _refused(self, error: Error, _payload: bytes) -> None:
        """A message the cloud will never store (it names another edge than this edge's key: spooled before its
        edge_id was corrected) is dropped and counted; resent, it blocked everything spooled after it for good."""
        self.link.note_refusal(error)
        if error.seq is not None:
            self._in_flight.pop(error.seq, None)
            if dropped := self.spool.ack([error.seq]):
                self.counts["refused"] += dropped
                log.warning("dropped spooled message %d: the cloud refuses it for good (%s)", error.seq, error.message)
            with self._drained:
                self._drained.notify_all()

    def _resend_all(self) -> None:
        """What was in flight may be lost: send everything unacknowledged again, from the oldest."""
        self._in_flight.clear()
        self._cursor = 0

    def _resend_expired(self, now: float) -> None:
        for seq in [seq for seq, sent in self._in_flight.items() if now - sent >= self.resend_after]:
            frames = self.spool.get(seq)
            if frames is None:  # dropped from the spool meanwhile
                del self._in_flight[seq]
            elif self._transmit(seq, frames, now):
                log.debug("resent seq %d: no ack within %.1f s", seq, self.resend_after)
            else:
                self._in_flight[seq] = now  # cannot go now: try again after another resend period
                return

    def _send_new(self, now: float) -> None:
        room, newest = self.link.config.window - len(self._in_flight), self.spool.last_seq
        if room <= 0 or self._cursor >= newest:
            return
        batch = self.spool.after(self._cursor, room)
        if not batch:
            self._cursor = newest  # everything up to it was acknowledged or dropped
        for seq, frames in batch:
            if not self._transmit(seq, frames, now):
                return
            self._cursor = seq

    def _transmit(self, seq: int, frames: Frames, now: float) -> bool:
        if not self.link.send(frames):
            return False
        self._in_flight[seq] = now
        self.counts["sent_messages"] += 1
        self.counts["sent_bytes"] += sum(len(frame) for frame in frames)
        return True
