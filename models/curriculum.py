"""Curriculum learning schedules: the difficulty (window W, resolution, ...) to train at, per step.

Schedules (Li, Zhang, He 2021; the scheduler users know from DeepSpeed), steps counted from 1,
T = total_steps, Δ = difficulty_step:

* ``fixed_root``: d = ⌊(s/T)^(1/root_degree)·(max − min) + min⌋, then d ← d − (d mod Δ), d ≤ max;
  steps past T stay at max.
* ``fixed_linear``: fixed_root with root_degree 1.
* ``fixed_discrete``: ``difficulties`` and ``max_steps`` (one shorter): the first difficulty whose
  max_step ≥ s, the last difficulty after the last max_step.

The formula as written reproduces the golden values (fixed_linear 2→10, T=8, Δ=2 gives 2,4,4,6,6,8,8,10,10,10
at steps 1..10; fixed_discrete [1..5] with max steps [2,4,6,8] gives 1,1,2,2,3,3,4,4,5 at steps 1..9).
Two choices make it exact and safe:

* The floor is taken in integer arithmetic (largest a with a^k·T ≤ (max−min)^k·s), so float rounding
  (0.29·100 = 28.999…) never moves a step.
* min and max must be multiples of Δ: otherwise d − (d mod Δ) could fall below min or never reach max.
"""

from __future__ import annotations

import logging
import math
from itertools import pairwise
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.errors import FilterForwardError, validation_summary

logger = logging.getLogger(__name__)

Schedule = Literal["fixed_linear", "fixed_root", "fixed_discrete"]


class CurriculumConfig(BaseModel):
    """A validated curriculum schedule; fields that do not apply to the schedule must stay unset."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: Schedule
    min_difficulty: int = Field(ge=1)
    max_difficulty: int = Field(ge=1)
    total_steps: int | None = Field(None, ge=1, description="curriculum length T (fixed_linear, fixed_root)")
    difficulty_step: int = Field(1, ge=1, description="difficulties are multiples of this (fixed_linear, fixed_root)")
    root_degree: int | None = Field(None, ge=1, description="k in (s/T)^(1/k) (fixed_root)")
    difficulties: list[int] | None = Field(None, min_length=1, description="the levels (fixed_discrete)")
    max_steps: list[int] | None = Field(None, description="last step of each level but the last (fixed_discrete)")

    @model_validator(mode="after")
    def _consistent(self) -> CurriculumConfig:
        if self.min_difficulty > self.max_difficulty:
            raise ValueError(f"min_difficulty {self.min_difficulty} is above max_difficulty {self.max_difficulty}")
        if self.schedule == "fixed_discrete":
            self._check_discrete()
        else:
            self._check_continuous()
        return self

    def _check_continuous(self) -> None:
        if self.total_steps is None:
            raise ValueError(f"{self.schedule} needs total_steps")
        if self.difficulties is not None or self.max_steps is not None:
            raise ValueError(f"difficulties and max_steps belong to fixed_discrete, not {self.schedule}")
        if self.schedule == "fixed_root" and self.root_degree is None:
            raise ValueError("fixed_root needs root_degree")
        if self.schedule == "fixed_linear" and self.root_degree not in (None, 1):
            raise ValueError(f"fixed_linear has root_degree 1, got {self.root_degree}: use fixed_root")
        step = self.difficulty_step
        if self.min_difficulty % step or self.max_difficulty % step:
            raise ValueError(
                f"min_difficulty {self.min_difficulty} and max_difficulty {self.max_difficulty} "
                f"must be multiples of difficulty_step {step}"
            )

    def _check_discrete(self) -> None:
        if self.difficulties is None or self.max_steps is None:
            raise ValueError("fixed_discrete needs difficulties and max_steps")
        if self.total_steps is not None or self.root_degree is not None or self.difficulty_step != 1:
            raise ValueError("total_steps, root_degree and difficulty_step do not apply to fixed_discrete")
        if len(self.max_steps) != len(self.difficulties) - 1:
            raise ValueError(
                f"max_steps needs one entry fewer than difficulties, got {len(self.max_steps)} "
                f"for {len(self.difficulties)} difficulties"
            )
        if any(step < 1 for step in self.max_steps) or any(a >= b for a, b in pairwise(self.max_steps)):
            raise ValueError(f"max_steps must be positive and strictly increasing, got {self.max_steps}")
        outside = [d for d in self.difficulties if not self.min_difficulty <= d <= self.max_difficulty]
        if outside:
            raise ValueError(f"difficulties {outside} are outside [{self.min_difficulty}, {self.max_difficulty}]")


class CurriculumScheduler:
    """The difficulty at each training step (steps from 1) under one validated schedule."""

    def __init__(
        self,
        schedule: Schedule,
        min_difficulty: int,
        max_difficulty: int,
        total_steps: int | None = None,
        difficulty_step: int = 1,
        root_degree: int | None = None,
        difficulties: list[int] | None = None,
        max_steps: list[int] | None = None,
    ) -> None:
        self.config = _validated(
            {
                "schedule": schedule,
                "min_difficulty": min_difficulty,
                "max_difficulty": max_difficulty,
                "total_steps": total_steps,
                "difficulty_step": difficulty_step,
                "root_degree": root_degree,
                "difficulties": difficulties,
                "max_steps": max_steps,
            }
        )
        self.last_step: int | None = None

    def difficulty(self, step: int) -> int:
        """The difficulty at step (>= 1); the step is remembered as last_step for state_dict."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise FilterForwardError(f"curriculum steps count from 1, got {step!r}: pass the 1-based training step")
        self.last_step = step
        if self.config.schedule == "fixed_discrete":
            return _discrete(self.config, step)
        return _root(self.config, step)

    @property
    def current_difficulty(self) -> int:
        """The difficulty at last_step (min_difficulty before the first step)."""
        if self.last_step is None:
            return self.config.min_difficulty
        return self.difficulty(self.last_step)

    def state_dict(self) -> dict[str, Any]:
        return {"config": self.config.model_dump(), "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore config and last_step (the schedule is a pure function of the step, so that is all)."""
        if set(state) != {"config", "last_step"}:
            raise FilterForwardError(
                f"curriculum state needs keys config and last_step, got {sorted(state)}: pass a state_dict() result"
            )
        config = _validated(state["config"])
        last_step = state["last_step"]
        if last_step is not None and (not isinstance(last_step, int) or last_step < 1):
            raise FilterForwardError(f"curriculum state has last_step {last_step!r}: it must be None or >= 1")
        self.config, self.last_step = config, last_step


def _validated(fields: dict[str, Any]) -> CurriculumConfig:
    try:
        return CurriculumConfig.model_validate(fields)
    except ValidationError as exc:
        raise FilterForwardError(
            f"bad curriculum: {validation_summary(exc, 'curriculum')}; fix the curriculum settings"
        ) from None


def _root(config: CurriculumConfig, step: int) -> int:
    """fixed_root / fixed_linear: ⌊(s/T)^(1/k)·(max−min)⌋ + min, rounded down to the difficulty step, capped."""
    assert config.total_steps is not None  # guaranteed by CurriculumConfig
    span = config.max_difficulty - config.min_difficulty
    reached = _floor_root_fraction(min(step, config.total_steps), config.total_steps, span, config.root_degree or 1)
    value = config.min_difficulty + reached
    value -= value % config.difficulty_step
    return min(value, config.max_difficulty)


def _floor_root_fraction(step: int, total: int, span: int, degree: int) -> int:
    """Exactly ⌊span·(step/total)^(1/degree)⌋: the largest a >= 0 with a^degree·total <= span^degree·step."""
    bound = span**degree * step
    guess = math.floor(span * (step / total) ** (1 / degree))  # close; the loops make it exact
    while guess > 0 and guess**degree * total > bound:
        guess -= 1
    while (guess + 1) ** degree * total <= bound:
        guess += 1
    return guess


def _discrete(config: CurriculumConfig, step: int) -> int:
    """fixed_discrete: the first difficulty whose max_step >= step, else the last."""
    assert config.difficulties is not None and config.max_steps is not None  # guaranteed by CurriculumConfig
    return next(
        (level for level, last in zip(config.difficulties[:-1], config.max_steps, strict=True) if step <= last),
        config.difficulties[-1],
    )
