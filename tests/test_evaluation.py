"""The paper's event F1 and bandwidth: hand-computed cases, edge cases, properties and the real labels."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from models.errors import FilterForwardError
from models.evaluation import EventScores, bandwidth_bps, event_f1, runs

TWO_EVENTS = np.array([0, 0, 1, 1, 1, 0, 0, 1, 1, 0])


def test_runs() -> None:
    assert runs(np.array([], dtype=bool)) == []
    assert runs(np.array([True, True, False, True])) == [(0, 1), (3, 3)]
    assert runs(np.array([False, True, True, True, False])) == [(1, 3)]
    assert runs(np.ones(4, dtype=bool)) == [(0, 3)]


def test_perfect_prediction() -> None:
    assert event_f1(TWO_EVENTS, TWO_EVENTS == 1) == EventScores(
        precision=1.0, event_recall=1.0, f1=1.0, existence=1.0, overlap=1.0, frame_recall=1.0,
        tp=5, fp=0, fn=0, n_events=2, n_detected=2,
    )  # fmt: skip


def test_empty_prediction() -> None:
    scores = event_f1(TWO_EVENTS, np.zeros(10, dtype=bool))
    assert (scores.precision, scores.event_recall, scores.f1) == (1.0, 0.0, 0.0)
    assert (scores.tp, scores.fp, scores.fn, scores.n_detected) == (0, 0, 5, 0)


def test_one_of_two_events_found() -> None:
    predicted = np.array([0, 0, 1, 1, 1, 0, 0, 0, 0, 0], dtype=bool)
    scores = event_f1(TWO_EVENTS, predicted)
    assert (scores.existence, scores.overlap) == (0.5, 0.5)
    assert scores.event_recall == pytest.approx(0.9 * 0.5 + 0.1 * 0.5)
    assert scores.f1 == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert scores.frame_recall == pytest.approx(3 / 5)
    assert (scores.n_events, scores.n_detected) == (2, 1)


def test_partial_overlap() -> None:
    labels = np.array([0, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    predicted = np.array([0, 0, 0, 0, 1, 1, 1, 1, 0, 0])
    scores = event_f1(labels, predicted)
    assert (scores.tp, scores.fp, scores.fn) == (2, 2, 2)
    assert scores.precision == 0.5
    assert scores.event_recall == pytest.approx(0.9 + 0.1 * 0.5)
    assert scores.f1 == pytest.approx(2 * 0.5 * 0.95 / 1.45)


def test_uncertain_frames_are_dropped_and_do_not_split_events() -> None:
    labels = np.array([0, 1, -1, 1, 0, -1, -1, 0])
    predicted = np.array([0, 0, 1, 1, 0, 1, 1, 0])  # positives on -1 frames count for nothing
    scores = event_f1(labels, predicted)
    assert scores.n_events == 1
    assert (scores.tp, scores.fp, scores.fn) == (1, 0, 1)
    assert (scores.precision, scores.existence, scores.overlap) == (1.0, 1.0, 0.5)


def test_a_detection_on_an_uncertain_frame_does_not_make_an_event_exist() -> None:
    labels = np.array([0, 1, -1, 1, 0])
    assert event_f1(labels, np.array([0, 0, 1, 0, 0])).existence == 0.0


def test_tolerance_ignores_frames_beside_transitions() -> None:
    labels = np.array([0] * 5 + [1] * 6 + [0] * 5)  # event 5..10
    predicted = np.zeros(16, dtype=bool)
    predicted[3:10] = True  # starts two frames early, ends one frame early

    strict = event_f1(labels, predicted)
    assert (strict.tp, strict.fp, strict.fn) == (5, 2, 1)
    assert strict.overlap == pytest.approx(5 / 6)

    # Tolerance 2 leaves frames 3..6 and 9..12 out: 7, 8 are hits and nothing else is wrong.
    tolerant = event_f1(labels, predicted, tolerance=2)
    assert (tolerant.tp, tolerant.fp, tolerant.fn) == (2, 0, 0)
    assert tolerant.f1 == 1.0


def test_tolerance_has_no_boundary_at_the_clip_edge() -> None:
    labels = np.array([1, 1, 1, 0, 0, 0])
    predicted = np.array([0, 0, 0, 0, 0, 1], dtype=bool)
    scores = event_f1(labels, predicted, tolerance=1)  # only frames 2 and 3 are left out
    assert (scores.tp, scores.fp, scores.fn) == (0, 1, 2)


def test_tolerance_spans_uncertain_frames_at_a_transition() -> None:
    labels = np.array([0, 0, 0, -1, -1, 1, 1, 1, 1])
    predicted = np.array([0, 0, 1, 0, 0, 0, 1, 1, 1], dtype=bool)
    scores = event_f1(labels, predicted, tolerance=1)  # transition between 2 and 5: frames 2..5 left out
    assert (scores.tp, scores.fp, scores.fn) == (3, 0, 0)


def test_event_inside_the_tolerance_zone_scores_by_existence() -> None:
    labels = np.array([0, 0, 1, 1, 0, 0])
    found = event_f1(labels, np.array([0, 0, 1, 0, 0, 0]), tolerance=2)
    missed = event_f1(labels, np.zeros(6, dtype=bool), tolerance=2)
    assert (found.overlap, found.event_recall) == (1.0, 1.0)
    assert (missed.overlap, missed.event_recall, missed.f1) == (0.0, 0.0, 0.0)


def test_no_events() -> None:
    assert event_f1(np.zeros(5, dtype=int), np.zeros(5, dtype=bool)).f1 == 1.0
    false_alarm = event_f1(np.zeros(5, dtype=int), np.array([0, 1, 0, 0, 0]))
    assert (false_alarm.precision, false_alarm.event_recall, false_alarm.f1) == (0.0, 1.0, 0.0)


@pytest.mark.parametrize("seed", range(5))
def test_properties_on_random_labels(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = np.repeat(rng.choice([-1, 0, 1], size=30, p=[0.1, 0.5, 0.4]), rng.integers(1, 8, 30))
    predicted = rng.random(labels.size) < 0.4
    for tolerance in (0, 1, 3):
        scores = event_f1(labels, predicted, tolerance)
        for value in (scores.precision, scores.event_recall, scores.f1, scores.existence, scores.overlap):
            assert 0.0 <= value <= 1.0
        assert scores.f1 <= max(scores.precision, scores.event_recall)
        assert scores.n_detected <= scores.n_events
        assert event_f1(labels, labels == 1, tolerance).f1 == 1.0


@pytest.mark.parametrize(
    ("labels", "predicted", "tolerance", "message"),
    [
        ([0, 1], [0, 1, 0], 0, "one length"),
        ([0, 2], [0, 1], 0, "uncertain"),
        ([0, 1], [0.0, 0.7], 0, "0/1"),
        ([0, 1], [0, 1], -1, "tolerance"),
    ],
)
def test_bad_input(labels: list, predicted: list, tolerance: int, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message):
        event_f1(np.array(labels), np.array(predicted), tolerance)


def test_bandwidth() -> None:
    assert bandwidth_bps(1000, n_frames=25, fps=12.5) == 4000.0
    for bad in [(1000, 0, 12.5), (1000, 25, 0.0), (-1, 25, 12.5)]:
        with pytest.raises(FilterForwardError):
            bandwidth_bps(*bad)


def vehicle_labels(folder: Path) -> np.ndarray:
    with open(folder / "labels.csv", newline="") as file:
        return np.array([int(row["vehicle_present"]) for row in csv.DictReader(file)])


def test_real_labels_shifted_by_two_frames_are_perfect_within_tolerance_two(intel_car: Path) -> None:
    labels = vehicle_labels(intel_car)
    shifted = np.roll(labels == 1, 2)
    assert event_f1(labels, shifted, tolerance=2).f1 == 1.0
    strict = event_f1(labels, shifted)
    assert strict.n_events == 3  # cars B and C overlap in time: one event
    assert (strict.fp, strict.fn) == (6, 6)
    assert strict.f1 < 1.0
