"""Progress bars for people at a terminal: output that goes to a pipe, a file or a log (CI, `docker logs`, a trainer
service) gets none, as a bar there is one line of carriage returns that grows with every update."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm


def progress_bar(enabled: bool, **options: Any) -> tqdm:
    """A tqdm bar (`options` as tqdm's), shown only when `enabled` and stderr is a terminal."""
    return tqdm(disable=None if enabled else True, **options)  # tqdm's None: off where its file is no terminal
