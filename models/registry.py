"""The shape of every extension point (MC kinds, optimizers, notification channels): entries by name.

A new entry is one item in its registry's list; everything that offers, validates or builds that kind of thing
(specs, configs, CLI choices and help, trainers) reads the registry instead of naming its entries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from models.errors import FilterForwardError


class Named(Protocol):
    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


class Registry(dict[str, E]):
    """The entries of one extension point by name, in the order they are offered."""

    def __init__(self, what: str, entries: Iterable[E]) -> None:
        super().__init__((entry.name, entry) for entry in entries)
        self.what = what

    def lookup(self, name: str) -> E:
        """The entry called `name`, or FilterForwardError naming the ones there are."""
        if name not in self:
            raise FilterForwardError(f"unknown {self.what} {name!r}: choose one of {', '.join(self)}")
        return self[name]
