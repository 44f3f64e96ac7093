"""Shared fixtures: where the real camera clips are, and a scratch cache for exported models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """The real clips: $FILTERFORWARD_DATA, else ../shared/data beside the checkout."""
    env = os.environ.get("FILTERFORWARD_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    return next((path for path in candidates if path.is_dir()), None)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("real clips not found: set FILTERFORWARD_DATA or put them at ../shared/data")
    return path


@pytest.fixture(scope="session")
def intel_car(shared_data: Path) -> Path:
    path = shared_data / "intel-car-detection"
    if not path.is_dir():
        pytest.skip(f"{path} is missing")
    return path
