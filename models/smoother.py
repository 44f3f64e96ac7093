"""Per-MC causal k-of-N voting that turns raw per-frame scores into positive frames and events.

The rule, exactly (used live by `Smoother`; `smooth_scores` computes the same decisions over a whole array):

* A frame *passes* when its raw score >= threshold (NaN never passes).
* The *vote* at frame t is true when at least k of the last n pushed frames (t included) pass.
* An event **starts** at the first frame whose vote is true while no event is open. Its start is
  back-dated (pre-roll) to the first passing frame of the current window that is later than the
  previous event's end, so the frames that triggered it count too; every frame from that start up to
  t-1 is reported as `Decision.backfill`.
* While an event is open, a passing frame is positive at once. A frame that does not pass but keeps
  the vote true is *held*: it becomes positive (reported in a later `backfill`) only if another frame
  passes before the vote fails, i.e. it turns out to be a gap inside the event.
* The event **ends** when the vote fails; its end is its last passing frame, and held frames after it
  are dropped. So an event always starts and ends on a passing frame and the up to n-k trailing frames
  that only kept the vote alive are never sent. `flush()` ends an open event the same way.
  The price: a gap frame inside an event is sent up to n-k frames late, never early or twice.

Every frame `backfill` names is within the last n pushed frames, which is what the pipeline keeps.
Frame indices must increase but may skip (a realtime source drops frames); "the last n" counts pushes.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from models.errors import FilterForwardError
from models.evaluation import runs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One detected event of one filter on one camera; end fields are None while it is open."""

    id: str
    filter: str
    camera: str
    start_frame: int
    start_time: float
    end_frame: int | None
    end_time: float | None
    peak_score: float
    peak_frame: int  # the frame with the peak score so far (the event's thumbnail)


@dataclass(frozen=True)
class Decision:
    """The outcome of one push.

    `positive` is False for a held frame too (its fate is decided later); `backfill` lists earlier frame
    indices that just became positive, oldest first; `started`/`ended` carry an event as it opens/closes.
    """

    positive: bool
    backfill: list[int] = field(default_factory=list)
    started: Event | None = None
    ended: Event | None = None


@dataclass(frozen=True)
class _Frame:
    index: int
    timestamp: float
    score: float
    passed: bool


@dataclass
class _OpenEvent:
    start: _Frame
    last_pass: _Frame
    peak: _Frame
    held: list[int] = field(default_factory=list)


class Smoother:
    """Causal k-of-N voting and event tracking for one filter on one camera (rule in the module doc)."""

    def __init__(self, filter: str, camera: str, threshold: float, k: int, n: int) -> None:
        validate_smoothing(threshold, k, n)
        self.filter = filter
        self.camera = camera
        self.threshold = threshold
        self.k = k
        self._window: deque[_Frame] = deque(maxlen=n)
        self._passes = 0
        self._open: _OpenEvent | None = None
        self._last_index: int | None = None
        self._last_end: int | None = None

    def push(self, frame_index: int, timestamp: float, score: float) -> Decision:
        """Feed the next frame's raw score; `timestamp` is stream time in seconds."""
        if self._last_index is not None and frame_index <= self._last_index:
            raise ValueError(f"frame indices must increase: got {frame_index} after {self._last_index}")
        self._last_index = frame_index
        frame = _Frame(frame_index, timestamp, score, bool(score >= self.threshold))
        self._slide(frame)
        vote = self._passes >= self.k
        if self._open is None:
            return self._start(frame) if vote else Decision(positive=False)
        if not vote:
            return Decision(positive=False, ended=self._close())
        return self._extend(frame)

    def flush(self) -> Event | None:
        """End of stream: close the open event (if any) and forget the window."""
        ended = self._close() if self._open is not None else None
        self._window.clear()
        self._passes = 0
        return ended

    def _slide(self, frame: _Frame) -> None:
        if len(self._window) == self._window.maxlen and self._window[0].passed:
            self._passes -= 1
        self._window.append(frame)
        self._passes += frame.passed

    def _start(self, frame: _Frame) -> Decision:
        # The vote can only rise on a passing frame, so `frame` passes and the pre-roll search succeeds.
        after = -1 if self._last_end is None else self._last_end
        first = next(f for f in self._window if f.passed and f.index > after)
        self._open = _OpenEvent(start=first, last_pass=frame, peak=self._peak_since(first.index))
        backfill = [f.index for f in self._window if first.index <= f.index < frame.index]
        started = self._event(end=None)
        log.debug("event %s started at frame %d (pre-roll %d frames)", started.id, frame.index, len(backfill))
        return Decision(positive=True, backfill=backfill, started=started)

    def _extend(self, frame: _Frame) -> Decision:
        assert self._open is not None
        if not frame.passed:
            self._open.held.append(frame.index)
            return Decision(positive=False)
        backfill, self._open.held = self._open.held, []
        self._open.last_pass = frame
        if frame.score > self._open.peak.score:
            self._open.peak = frame
        return Decision(positive=True, backfill=backfill)

    def _close(self) -> Event:
        assert self._open is not None
        ended = self._event(end=self._open.last_pass)
        self._last_end = self._open.last_pass.index
        self._open = None
        log.debug("event %s ended at frame %d", ended.id, ended.end_frame)
        return ended

    def _peak_since(self, index: int) -> _Frame:
        return max((f for f in self._window if f.passed and f.index >= index), key=lambda f: f.score)

    def _event(self, end: _Frame | None) -> Event:
        assert self._open is not None
        start = self._open.start
        return Event(
            id=f"{self.camera}/{self.filter}/{start.index}",
            filter=self.filter,
            camera=self.camera,
            start_frame=start.index,
            start_time=start.timestamp,
            end_frame=None if end is None else end.index,
            end_time=None if end is None else end.timestamp,
            peak_score=self._open.peak.score,
            peak_frame=self._open.peak.index,
        )


def validate_smoothing(threshold: float, k: int, n: int) -> None:
    """Raise FilterForwardError unless 0 < threshold < 1 and 1 <= k <= n."""
    if not 0.0 < threshold < 1.0:  # also rejects NaN
        raise FilterForwardError(f"smoothing threshold must be strictly between 0 and 1, got {threshold!r}")
    if not 1 <= k <= n:
        raise FilterForwardError(f"smoothing needs 1 <= k <= n, got k={k}, n={n}: lower k or raise n")


def smooth_scores(scores: np.ndarray, threshold: float, k: int, n: int) -> np.ndarray:
    """The positive frames `Smoother` gives over frames 0..len-1 (for evaluation/training), computed from the rule
    on whole arrays: cross-validation replays thousands of (threshold, k-of-n) points, too many for a push each.
    Each run of true votes is one event, from the first passing frame of the window that opened it (later than the
    last event's end) to its last passing frame."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise FilterForwardError(f"scores must be a 1-D array, got shape {scores.shape}")
    validate_smoothing(threshold, k, n)
    passes = scores >= threshold  # NaN never passes
    counts = np.cumsum(passes)
    in_window = counts - np.concatenate((np.zeros(n, dtype=counts.dtype), counts[:-n]))[: counts.size]
    passing = np.flatnonzero(passes)
    positive = np.zeros(scores.size, dtype=bool)
    last_end = -1
    for opened, closed in runs(in_window >= k):
        # The vote rises only on a passing frame, so `opened` passes and so does a frame of every run.
        first = passing[np.searchsorted(passing, max(opened - n + 1, last_end + 1))]
        last_end = int(passing[np.searchsorted(passing, closed, side="right") - 1])
        positive[first : last_end + 1] = True
    return positive
