"""k-of-N voting and event tracking: hand-traced cases, then properties over random score streams."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.errors import FilterForwardError
from models.evaluation import runs
from models.smoother import Decision, Event, Smoother, smooth_scores

HI, LO = 0.9, 0.1  # a passing and a failing score at threshold 0.5


def push_all(smoother: Smoother, scores: list[float], fps: float = 10.0) -> list[Decision]:
    return [smoother.push(i, i / fps, s) for i, s in enumerate(scores)]


@pytest.mark.parametrize(
    ("threshold", "k", "n"),
    [(0.0, 1, 1), (1.0, 1, 1), (math.nan, 1, 1), (-0.5, 1, 1), (0.5, 4, 3), (0.5, 0, 3)],
)
def test_bad_settings_are_rejected(threshold: float, k: int, n: int) -> None:
    with pytest.raises(FilterForwardError):
        Smoother("f", "cam", threshold, k, n)
    with pytest.raises(FilterForwardError):
        smooth_scores(np.zeros(3), threshold, k, n)


def test_event_starts_with_preroll_and_ends_at_last_passing_frame() -> None:
    smoother = Smoother("cars", "cam0", 0.5, k=3, n=5)
    #        0   1   2   3    4   5   6   7
    scores = [LO, HI, LO, 0.7, HI, LO, LO, LO]
    decisions = push_all(smoother, scores)

    assert [d.positive for d in decisions] == [False, False, False, False, True, False, False, False]
    start = decisions[4]
    assert start.backfill == [1, 2, 3]  # pre-roll from the first passing frame of the window
    assert start.started == Event("cam0/cars/1", "cars", "cam0", 1, 0.1, None, None, 0.9, peak_frame=1)
    # Frame 5 keeps the vote alive (1, 3, 4 in 1..5) but is held; at 6 the vote fails and 5 is dropped.
    assert decisions[5] == Decision(positive=False)
    assert decisions[6].ended == Event("cam0/cars/1", "cars", "cam0", 1, 0.1, 4, 0.4, 0.9, peak_frame=1)
    assert smooth_scores(np.array(scores), 0.5, 3, 5).tolist() == [False, True, True, True, True, False, False, False]


def test_gap_inside_an_event_is_backfilled_when_a_later_frame_passes() -> None:
    smoother = Smoother("cars", "cam0", 0.5, k=3, n=5)
    decisions = push_all(smoother, [HI, HI, HI, LO, HI, LO, LO, LO])

    assert decisions[2].backfill == [0, 1]
    assert decisions[3] == Decision(positive=False)
    assert decisions[4] == Decision(positive=True, backfill=[3])
    ended = [d.ended for d in decisions if d.ended]
    assert [(e.start_frame, e.end_frame) for e in ended] == [(0, 4)]


def test_preroll_never_reaches_into_the_previous_event() -> None:
    smoother = Smoother("cars", "cam0", 0.5, k=2, n=3)
    decisions = push_all(smoother, [HI, LO, HI, LO, HI, HI, LO, LO, LO])

    first, second = (d.started for d in decisions if d.started)
    assert (first.start_frame, second.start_frame) == (0, 4)
    # At frame 4 the vote counts frame 2 (already sent in the first event): no backfill of 2 or 3.
    assert decisions[4].backfill == []
    assert decisions[3].ended is not None and decisions[3].ended.end_frame == 2


def test_skipped_frame_indices_and_stream_timestamps_are_kept() -> None:
    smoother = Smoother("cars", "cam0", 0.5, k=2, n=3)
    pushes = [(10, 100.0, HI), (13, 100.3, LO), (17, 100.7, HI), (18, 100.8, LO), (25, 101.5, LO)]
    decisions = [smoother.push(*p) for p in pushes]

    assert decisions[2].backfill == [10, 13]
    assert decisions[2].started.start_time == 100.0
    assert decisions[3].ended == Event("cam0/cars/10", "cars", "cam0", 10, 100.0, 17, 100.7, 0.9, peak_frame=10)


def test_the_peak_frame_follows_the_highest_score() -> None:
    smoother = Smoother("cars", "cam0", 0.5, k=2, n=3)
    decisions = push_all(smoother, [0.6, 0.7, 0.95, 0.8, LO, LO, LO])
    started, ended = decisions[1].started, next(d.ended for d in decisions if d.ended)
    assert (started.peak_frame, started.peak_score) == (1, 0.7)  # the best of the pre-roll so far
    assert (ended.peak_frame, ended.peak_score) == (2, 0.95)


def test_frame_indices_must_increase() -> None:
    smoother = Smoother("cars", "cam0", 0.5, k=1, n=1)
    smoother.push(5, 0.5, HI)
    with pytest.raises(ValueError, match="increase"):
        smoother.push(5, 0.6, HI)


def test_flush_closes_the_open_event_and_resets_the_window() -> None:
    smoother = Smoother("cars", "cam0", 0.5, k=2, n=4)
    push_all(smoother, [HI, 0.95, LO])
    ended = smoother.flush()
    assert ended is not None
    assert (ended.start_frame, ended.end_frame, ended.peak_score) == (0, 1, 0.95)
    assert smoother.flush() is None
    # The window is empty again: one pass after the flush is not enough for k=2.
    assert smoother.push(10, 1.0, HI).positive is False


def test_k_equals_n_equals_one_is_plain_thresholding() -> None:
    scores = np.array([0.2, 0.5, 0.49, 0.8, 0.8, 0.1, math.nan])
    assert smooth_scores(scores, 0.5, 1, 1).tolist() == (scores >= 0.5).tolist()


def test_scores_must_be_one_dimensional() -> None:
    with pytest.raises(FilterForwardError, match="1-D"):
        smooth_scores(np.zeros((2, 3)), 0.5, 1, 1)


@pytest.mark.parametrize("seed", range(60))  # smooth_scores is a second implementation of the rule
def test_properties_on_random_streams(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    k = int(rng.integers(1, n + 1))
    # Bursty scores, so events of many lengths and gaps occur, and a few frames not scored (NaN).
    scores = np.repeat(rng.random(40), rng.integers(1, 6, 40))
    scores = np.clip(scores + rng.normal(0, 0.15, scores.size), 0, 1)
    scores[rng.random(scores.size) < 0.03] = math.nan
    passes = scores >= 0.5
    vote = np.convolve(passes, np.ones(n, dtype=int))[: passes.size] >= k

    smoother = Smoother("f", "c", 0.5, k, n)
    positive = np.zeros(scores.size, dtype=bool)
    events: list[Event] = []
    for i, score in enumerate(scores.tolist()):
        decision = smoother.push(i, i / 10, score)
        assert all(i - n < j < i for j in decision.backfill), "backfill must stay within the last n frames"
        assert not positive[decision.backfill].any(), "no frame is reported positive twice"
        positive[decision.backfill] = True
        assert not (decision.positive and positive[i])
        positive[i] = decision.positive
        events += [decision.ended] if decision.ended else []
    events += [e for e in [smoother.flush()] if e]

    assert np.array_equal(positive, smooth_scores(scores, 0.5, k, n))
    assert (positive | ~(passes & vote)).all(), "every passing frame with a true vote is positive"
    assert runs(positive) == [(e.start_frame, e.end_frame) for e in events]
    for start, end in runs(positive):
        assert passes[start] and passes[end], "events start and end on passing frames"
        assert vote[start : end + 1].any()
