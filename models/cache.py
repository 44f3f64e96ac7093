"""Where exported models and feature caches live on disk ($FILTERFORWARD_CACHE, else ~/.cache/filterforward)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    root = Path(os.environ.get("FILTERFORWARD_CACHE", Path.home() / ".cache" / "filterforward"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
