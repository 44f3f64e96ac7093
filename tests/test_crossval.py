"""Cross-validation over time: folds that hold out whole occurrences, the operating point they choose, and the
estimate and warnings a filter carries."""

from __future__ import annotations

import numpy as np

from models.crossval import (
    FINAL_THRESHOLD,
    THRESHOLDS,
    OperatingPoint,
    choose_operating_point,
    occurrences,
    plan_folds,
    summarize,
)


def labels_with(length: int, *intervals: tuple[int, int]) -> np.ndarray:
    labels = np.zeros(length, np.int8)
    for first, last in intervals:
        labels[first : last + 1] = 1
    return labels


def test_occurrences_merge_runs_split_by_a_short_gap() -> None:
    labels = labels_with(100, (10, 20), (23, 30), (60, 70))
    labels[40] = -1
    assert occurrences(labels, (0, 100), merge_gap=3) == [(10, 30), (60, 70)]
    assert occurrences(labels, (0, 100), merge_gap=1) == [(10, 20), (23, 30), (60, 70)]
    assert occurrences(labels, (15, 65), merge_gap=3) == [(15, 30), (60, 64)]


def test_folds_hold_out_whole_occurrences_with_a_guard_band() -> None:
    labels = labels_with(300, (20, 40), (100, 130), (200, 220))
    plan = plan_folds(labels, (0, 300), merge_gap=5, guard=10)
    assert plan.method == "occurrences" and plan.occurrences == 3 and len(plan.folds) == 3
    held = [(int(f.held_out[0]), int(f.held_out[-1])) for f in plan.folds]
    assert held == [(0, 69), (70, 164), (165, 299)]  # cut half-way through the gaps
    for fold in plan.folds:
        assert not np.isin(fold.train, fold.held_out).any()
        distance = np.abs(fold.train[:, None] - fold.held_out[None]).min()
        assert distance > 10
        assert (labels[fold.train] == 1).any() and (labels[fold.train] == 0).any()


def test_many_occurrences_share_at_most_four_folds() -> None:
    labels = labels_with(1000, *[(i, i + 20) for i in range(50, 950, 100)])
    plan = plan_folds(labels, (0, 1000), merge_gap=5, guard=5)
    assert len(plan.folds) == 4 and plan.occurrences == 9
    assert sum(f.held_out.size for f in plan.folds) == 1000


def test_one_occurrence_is_cut_in_thirds() -> None:
    labels = labels_with(120, (60, 89))
    labels[10] = -1
    plan = plan_folds(labels, (0, 120), merge_gap=5, guard=2)
    assert plan.method == "blocks" and plan.occurrences == 1 and len(plan.folds) == 3
    positives = [f.held_out[labels[f.held_out] == 1] for f in plan.folds]
    assert [(p[0], p[-1]) for p in positives] == [(60, 69), (70, 79), (80, 89)]
    assert all(-1 not in labels[f.train] for f in plan.folds)


def test_occurrences_no_fold_can_hold_out_whole_are_cut_in_thirds_and_warned_about() -> None:
    # The second occurrence runs to the end of the labelled frames (a feedback round's "right" event) and nothing
    # before it is labelled: a fold holding the first occurrence out would train on positives only.
    labels = labels_with(400, (0, 234), (364, 399))
    labels[300:364] = -1
    plan = plan_folds(labels, (0, 400), merge_gap=30, guard=6)
    assert plan.method == "blocks" and plan.occurrences == 2 and len(plan.folds) == 3
    assert all((labels[f.train] == 1).any() and (labels[f.train] == 0).any() for f in plan.folds)
    scores = np.where(labels == 1, 0.8, 0.1)
    warnings = summarize(plan, scores, labels, n_positive=271).validation.warnings
    assert any("no whole occurrence could be held out" in w for w in warnings)
    assert not any("one occurrence" in w for w in warnings)


def test_too_little_data_gives_no_folds_to_validate_with() -> None:
    labels = labels_with(20, (0, 19))  # no negative at all
    assert len(plan_folds(labels, (0, 20), merge_gap=2, guard=2).folds) == 0


def test_one_positive_frame_gives_no_folds_rather_than_folds_without_the_event() -> None:
    """The one positive frame's third cannot be held out (its fold would train without positives); the other two
    folds hold out negatives only, and an event F1 over no events is 1.0: that estimate shipped as 1.000."""
    labels = np.zeros(30, np.int8)
    labels[5] = 1
    assert len(plan_folds(labels, (0, 30), merge_gap=2, guard=0).folds) == 0


def test_the_operating_point_is_the_middle_of_what_worked_on_held_out_frames() -> None:
    labels = labels_with(200, (50, 80), (140, 170))
    scores = np.where(labels == 1, 0.9, 0.02)
    point, f1 = choose_operating_point(scores, labels)
    assert f1 == 1.0
    working = THRESHOLDS[(THRESHOLDS > 0.02) & (THRESHOLDS <= 0.9)]
    assert working.min() < point.threshold < working.max()
    assert abs(np.log(point.threshold / (1 - point.threshold))) < 1.0  # near the middle in logit space
    nan_scores = scores.copy()
    nan_scores[:50] = np.nan  # frames no fold scored are left out
    assert choose_operating_point(nan_scores, labels)[1] == 1.0


def test_a_threshold_whose_neighbours_fail_is_not_chosen() -> None:
    labels = labels_with(400, (20, 40), (100, 120), (180, 200), (260, 280), (340, 360))
    logits = np.where(labels == 1, 3.0, -6.0)
    logits[340:361] = -1.9  # one occurrence scores low ...
    logits[290:335] = -2.4  # ... just above 45 frames without the event
    point, f1 = choose_operating_point(1 / (1 + np.exp(-logits)), labels)
    # Only thresholds in the half-logit gap between them find everything; the wide range that misses the weak
    # occurrence and never fires without the event is taken instead, in its middle.
    assert f1 < 1.0
    assert -1.5 < np.log(point.threshold / (1 - point.threshold)) < 2.5


def test_the_final_model_keeps_the_held_out_k_of_n_at_its_own_threshold_and_is_estimated_there() -> None:
    labels = labels_with(300, (20, 40), (100, 130), (200, 220))
    plan = plan_folds(labels, (0, 300), merge_gap=5, guard=10)
    logits = np.where(labels == 1, 4.0, 1.5)  # fold models: the classes apart only above logit 1.5
    scores, n_positive = 1 / (1 + np.exp(-logits)), int((labels == 1).sum())
    held_out = summarize(plan, scores, labels, n_positive)  # what an --arch filter ships with
    held_out_logit = np.log(held_out.point.threshold / (1 - held_out.point.threshold))
    assert 1.5 < held_out_logit < 4.0 and held_out.validation.event_f1 == 1.0
    final = summarize(plan, scores, labels, n_positive, threshold=FINAL_THRESHOLD)  # the default filter's ...
    assert final.point == OperatingPoint(FINAL_THRESHOLD, held_out.point.k, held_out.point.n)  # ... k-of-n at 0.5
    # ... and its estimate measured there: every held-out frame scores above 0.5, so the filter would fire on all
    assert final.validation.event_f1 < 0.5 and final.validation.precision < 0.5
    assert final.validation.warnings and FINAL_THRESHOLD == 0.5
    # The same filter with a motion veto that holds back every frame without the event: estimated at the same point.
    vetoed = summarize(plan, np.where(labels == 1, scores, 0.0), labels, n_positive, point=final.point)
    assert vetoed.point == final.point and vetoed.validation.event_f1 == 1.0


def test_summary_estimates_and_warns_with_frames_to_label() -> None:
    labels = labels_with(300, (20, 40), (100, 130), (200, 220))
    plan = plan_folds(labels, (0, 300), merge_gap=5, guard=10)
    scores = np.where(labels == 1, 0.9, 0.05)
    scores[200:221] = 0.05  # the third occurrence is missed when held out ...
    scores[250:260] = 0.9  # ... and ten frames without the event fire
    result = summarize(plan, scores, labels, n_positive=int((labels == 1).sum()))
    validation = result.validation
    assert validation.method == "occurrences" and validation.folds == 3 and validation.occurrences == 3
    assert validation.f1_min < validation.event_f1 < validation.f1_max == 1.0
    text = " ".join(validation.warnings)
    assert "250-259 fired without the event" in text
    assert "200-220 were missed" in text


def test_one_occurrence_and_few_positives_are_warned_about() -> None:
    labels = labels_with(120, (60, 71))
    plan = plan_folds(labels, (0, 120), merge_gap=5, guard=2)
    scores = np.where(labels == 1, 0.8, 0.1)
    warnings = summarize(plan, scores, labels, n_positive=12).validation.warnings
    assert any("one occurrence" in w and "label frames with another occurrence" in w for w in warnings)
    assert any("only 12 frames show the event" in w for w in warnings)
    assert not any("runs of frames" in w for w in warnings)


def test_runs_of_the_event_close_together_are_one_occurrence_and_the_warning_says_so() -> None:
    labels = labels_with(200, (60, 90), (94, 120))  # somebody stepping off the region for three frames
    plan = plan_folds(labels, (0, 200), merge_gap=10, guard=2)
    assert (plan.occurrences, plan.runs, plan.method) == (1, 2, "blocks")
    warnings = summarize(plan, np.where(labels == 1, 0.8, 0.1), labels, n_positive=58).validation.warnings
    [warning] = [w for w in warnings if "one occurrence" in w]
    assert "(its 2 runs of frames are at most 10 frames apart, so they count as one)" in warning
