"""The curriculum scheduler: golden schedule values, fixed_root, config validation, state round-trip."""

from __future__ import annotations

import math

import pytest

from models.curriculum import CurriculumScheduler
from models.errors import FilterForwardError


def test_fixed_discrete_golden_values() -> None:
    scheduler = CurriculumScheduler("fixed_discrete", 1, 5, difficulties=[1, 2, 3, 4, 5], max_steps=[2, 4, 6, 8])
    assert [scheduler.difficulty(step) for step in range(1, 10)] == [1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert scheduler.difficulty(1000) == 5


def test_fixed_linear_golden_values() -> None:
    scheduler = CurriculumScheduler("fixed_linear", 2, 10, total_steps=8, difficulty_step=2)
    assert [scheduler.difficulty(step) for step in range(1, 11)] == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]


def test_fixed_root_follows_the_root_curve_on_the_difficulty_grid() -> None:
    scheduler = CurriculumScheduler("fixed_root", 8, 64, total_steps=100, difficulty_step=8, root_degree=2)
    values = [scheduler.difficulty(step) for step in range(1, 121)]
    for step, value in enumerate(values, start=1):
        # ⌊√(s/T)·56 + 8⌋ rounded down to a multiple of 8, capped at 64 (float is fine away from the grid).
        raw = math.floor(math.sqrt(min(step, 100) / 100) * 56 + 8)
        assert value == min(raw - raw % 8, 64), step
    # A square root front-loads the curriculum: at step 50 it is at 40 where fixed_linear would be at 32.
    assert values[49] == 40
    assert values[-21:] == [64] * 21


def test_fixed_linear_is_exact_where_floats_round_down() -> None:
    # 0.29 * 100 == 28.999999999999996 in floats; the step must still give difficulty 1 + 29.
    scheduler = CurriculumScheduler("fixed_linear", 1, 101, total_steps=100)
    assert scheduler.difficulty(29) == 30
    assert [scheduler.difficulty(step) for step in range(1, 101)] == list(range(2, 102))


def test_state_dict_round_trip() -> None:
    scheduler = CurriculumScheduler("fixed_root", 2, 16, total_steps=10, difficulty_step=2, root_degree=3)
    assert scheduler.current_difficulty == 2
    scheduler.difficulty(4)
    restored = CurriculumScheduler("fixed_linear", 1, 2, total_steps=1)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.config == scheduler.config
    assert restored.current_difficulty == scheduler.current_difficulty == scheduler.difficulty(4)
    assert [restored.difficulty(s) for s in range(1, 12)] == [scheduler.difficulty(s) for s in range(1, 12)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "fixed_cosine", "min_difficulty": 1, "max_difficulty": 4, "total_steps": 5}, "schedule"),
        ({"schedule": "fixed_linear", "min_difficulty": 8, "max_difficulty": 4, "total_steps": 5}, "above"),
        ({"schedule": "fixed_linear", "min_difficulty": 0, "max_difficulty": 4, "total_steps": 5}, "min_difficulty"),
        ({"schedule": "fixed_linear", "min_difficulty": 1, "max_difficulty": 4}, "needs total_steps"),
        ({"schedule": "fixed_linear", "min_difficulty": 1, "max_difficulty": 4, "total_steps": 0}, "total_steps"),
        ({"schedule": "fixed_root", "min_difficulty": 1, "max_difficulty": 4, "total_steps": 5}, "root_degree"),
        (
            {"schedule": "fixed_linear", "min_difficulty": 1, "max_difficulty": 4, "total_steps": 5, "root_degree": 2},
            "use fixed_root",
        ),
        (
            {
                "schedule": "fixed_linear",
                "min_difficulty": 3,
                "max_difficulty": 8,
                "total_steps": 5,
                "difficulty_step": 2,
            },
            "multiples of difficulty_step",
        ),
        (
            {"schedule": "fixed_linear", "min_difficulty": 1, "max_difficulty": 4, "total_steps": 5, "max_steps": [2]},
            "belong to fixed_discrete",
        ),
        ({"schedule": "fixed_discrete", "min_difficulty": 1, "max_difficulty": 4, "difficulties": [1, 2]}, "needs"),
        (
            {
                "schedule": "fixed_discrete",
                "min_difficulty": 1,
                "max_difficulty": 4,
                "difficulties": [1, 2],
                "max_steps": [],
            },
            "one entry fewer",
        ),
        (
            {
                "schedule": "fixed_discrete",
                "min_difficulty": 1,
                "max_difficulty": 4,
                "difficulties": [1, 2, 3],
                "max_steps": [4, 4],
            },
            "strictly increasing",
        ),
        (
            {
                "schedule": "fixed_discrete",
                "min_difficulty": 1,
                "max_difficulty": 4,
                "difficulties": [1, 9],
                "max_steps": [4],
            },
            "outside",
        ),
        (
            {
                "schedule": "fixed_discrete",
                "min_difficulty": 1,
                "max_difficulty": 4,
                "difficulties": [1, 2],
                "max_steps": [4],
                "total_steps": 10,
            },
            "do not apply",
        ),
    ],
)
def test_bad_configs_raise_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(FilterForwardError, match=message) as info:
        CurriculumScheduler(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("step", [0, -3, 1.5, True])
def test_steps_count_from_one(step: object) -> None:
    scheduler = CurriculumScheduler("fixed_linear", 1, 4, total_steps=5)
    with pytest.raises(FilterForwardError, match="count from 1"):
        scheduler.difficulty(step)  # type: ignore[arg-type]


def test_load_state_dict_rejects_foreign_state() -> None:
    scheduler = CurriculumScheduler("fixed_linear", 1, 4, total_steps=5)
    with pytest.raises(FilterForwardError, match="config and last_step"):
        scheduler.load_state_dict({"current_difficulty": 3})
    bad = scheduler.state_dict() | {"config": {**scheduler.state_dict()["config"], "total_steps": -1}}
    with pytest.raises(FilterForwardError, match="total_steps"):
        scheduler.load_state_dict(bad)
    assert scheduler.config.total_steps == 5
