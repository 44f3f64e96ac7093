"""Stopping a training from outside its threads: the fits of a filter run on a pool of threads, which no signal or
exception reaches, so a trainer whose job was cancelled (or given to another trainer) and a failure or Ctrl-C in
the thread that waits on the fits ask them to stop here; every optimizer step and every batch of base-DNN features
looks. One training runs in a process at a time (a trainer's job, a CLI command)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from models.errors import FilterForwardError


class TrainingStopped(FilterForwardError):
    """The training was asked to stop (its message says why)."""


_reason: str | None = None
_lock = threading.Lock()


def request_stop(reason: str) -> None:
    """Make every fit and feature pass of this process stop at its next step, raising TrainingStopped(reason); the
    first reason stands."""
    global _reason
    with _lock:
        if _reason is None:
            _reason = reason


def stop_requested() -> bool:
    return _reason is not None


def check_stop() -> None:
    """Raise TrainingStopped when a stop was requested (a step's cost: one read of a global)."""
    reason = _reason
    if reason is not None:
        raise TrainingStopped(reason)


def withdraw_stop() -> None:
    global _reason
    with _lock:
        _reason = None


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """A training that a stop request ends: requests from before it are forgotten, and so is one made during it."""
    withdraw_stop()
    try:
        yield
    finally:
        withdraw_stop()
